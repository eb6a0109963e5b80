// web_page.cpp — the embedded page (web_page.h). Everything the page shows from the server is set with
// textContent (never innerHTML), so captions and lyrics cannot inject markup. API calls go through
// fetch() with the optional bearer token (kept in localStorage); the event stream is read with fetch
// too, because EventSource cannot send an Authorization header; audio is fetched as a blob for the same
// reason.
#include "server/web_page.h"

namespace mm3::server {

namespace {

const char* const kPage = R"MM3PAGE(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>mm3 — MiniMax-Music3</title>
<style>
  body { font: 15px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 980px; padding: 16px; color: #1d1d1f; }
  h1 { font-size: 1.4em; margin: 0 0 4px; }
  .sub { color: #666; margin: 0 0 14px; }
  #banner { display: none; background: #fff3cd; border: 1px solid #e0c060; padding: 8px 12px; border-radius: 6px; margin-bottom: 12px; }
  #keybox { display: none; background: #eef; border: 1px solid #99c; padding: 8px 12px; border-radius: 6px; margin-bottom: 12px; }
  label { display: block; font-weight: 600; margin-top: 10px; }
  textarea, input, select { font: inherit; box-sizing: border-box; }
  textarea { width: 100%; }
  #caption { height: 4.5em; }
  #lyrics { height: 12em; font-family: ui-monospace, monospace; }
  .row { display: flex; gap: 16px; flex-wrap: wrap; align-items: end; }
  .row > div { flex: 0 0 auto; }
  .tags button { margin: 4px 4px 0 0; font-size: 0.85em; }
  button.primary { font-size: 1em; padding: 6px 18px; }
  .hint { color: #666; font-size: 0.85em; }
  #current { margin-top: 16px; padding: 10px 12px; border: 1px solid #ccc; border-radius: 6px; display: none; }
  progress { width: 100%; height: 14px; }
  #error { color: #b00020; white-space: pre-wrap; }
  table { border-collapse: collapse; width: 100%; margin-top: 8px; font-size: 0.9em; }
  th, td { text-align: left; padding: 4px 6px; border-bottom: 1px solid #eee; vertical-align: top; }
  tr.job { cursor: pointer; }
  tr.job:hover { background: #f5f7ff; }
  .state-done { color: #137333; } .state-failed { color: #b00020; } .state-cancelled { color: #777; }
  .state-running { color: #1a56db; } .state-queued { color: #8a6d00; }
  audio { width: 100%; margin-top: 8px; }
</style>
</head>
<body>
<h1>mm3 — MiniMax-Music3</h1>
<p class="sub">Lyrics and a style description in, a stereo song out. <span id="model"></span></p>
<div id="banner" role="alert">TEST MODE: this server runs the fake generator. Every result is a synthetic
  test tone, not music.</div>
<div id="keybox">This server needs an API key: <input id="apikey" type="password" size="30" autocomplete="off">
  <button id="savekey" type="button">Use key</button></div>

<form id="form">
  <label for="caption">Caption (style)</label>
  <textarea id="caption" required placeholder="Genre: acoustic pop. BPM: 96. Key: C major. Warm and intimate."></textarea>
  <label for="lyrics">Lyrics</label>
  <div class="tags">
    <span class="hint">Insert a section tag:</span>
    <button type="button" data-tag="intro">[intro]</button><button type="button" data-tag="verse">[verse]</button><button
      type="button" data-tag="pre-chorus">[pre-chorus]</button><button type="button" data-tag="chorus">[chorus]</button><button
      type="button" data-tag="bridge">[bridge]</button><button type="button" data-tag="outro">[outro]</button>
  </div>
  <textarea id="lyrics" required placeholder="[verse]&#10;Morning light filtering through the pine&#10;[chorus]&#10;Softly the world begins to breathe"></textarea>
  <div class="hint">Put each tag on its own line: text after a tag on the same line is dropped by the model's lyric normaliser.</div>
  <div class="row">
    <div><label for="duration">Duration (s, at most)</label><input id="duration" type="number" min="0.04" max="360" step="any" value="60" required></div>
    <div><label for="seed">Seed</label><input id="seed" type="text" inputmode="numeric" value="0" size="22" pattern="[0-9]{1,20}"></div>
    <div><label for="format">Format</label><select id="format"><option value="wav">WAV 16-bit</option><option value="flac">FLAC</option><option value="mp3">MP3</option></select></div>
    <div><button id="submit" class="primary" type="submit">Generate</button></div>
  </div>
  <div id="error" role="status"></div>
</form>

<section id="current" aria-live="polite">
  <div><b>Job</b> <code id="jobid"></code> — <span id="state"></span> <span id="stage"></span>
    <button id="cancel" type="button" style="display:none">Cancel</button></div>
  <progress id="progress" max="1" value="0"></progress>
  <div id="eta" class="hint"></div>
  <div id="result"></div>
</section>

<h2 style="font-size:1.1em;margin-top:22px">Recent jobs</h2>
<table><thead><tr><th>When</th><th>State</th><th>Caption</th><th>Length</th></tr></thead><tbody id="jobs"></tbody></table>

<script>
"use strict";
const $ = (id) => document.getElementById(id);
let current = null;      // id of the job shown
let streamAbort = null;  // AbortController of the event stream being read
let blobUrl = null;

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = localStorage.getItem("mm3_api_key");
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}
async function api(path, opts) {
  opts = opts || {};
  opts.headers = headers(opts.headers);
  const r = await fetch(path, opts);
  if (r.status === 401) $("keybox").style.display = "block";
  return r;
}
async function errorText(r) {
  try { const j = await r.json(); if (j.error) return j.error.message + " (" + j.error.code + ")"; } catch (e) {}
  return "HTTP " + r.status;
}
$("savekey").onclick = () => { localStorage.setItem("mm3_api_key", $("apikey").value); $("keybox").style.display = "none"; refreshJobs(); };

document.querySelectorAll(".tags button").forEach((b) => b.addEventListener("click", () => {
  const ta = $("lyrics"), tag = "[" + b.dataset.tag + "]";
  const pos = ta.selectionStart, before = ta.value.slice(0, pos), after = ta.value.slice(ta.selectionEnd);
  const pre = before.length && !before.endsWith("\n") ? "\n" : "";
  ta.value = before + pre + tag + "\n" + after;
  const caret = (before + pre + tag + "\n").length;
  ta.focus(); ta.setSelectionRange(caret, caret);
}));

async function health() {
  try {
    const r = await fetch("/health");
    const j = await r.json();
    $("model").textContent = j.status === "ok" ? "Model: " + j.model : "Model: " + j.status;
    $("banner").style.display = j.test_tone ? "block" : "none";
    if (j.status === "loading") setTimeout(health, 1000);
  } catch (e) { setTimeout(health, 2000); }
}

$("form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("error").textContent = "";
  const seed = $("seed").value.trim() || "0";
  if (!/^[0-9]{1,20}$/.test(seed) || BigInt(seed) > 18446744073709551615n) {
    $("error").textContent = "Seed must be a whole number from 0 to 18446744073709551615."; return;
  }
  const duration = Number($("duration").value);
  // The seed is spliced in as text: JSON.stringify would round integers above 2^53.
  const body = JSON.stringify({ caption: $("caption").value, lyrics: $("lyrics").value, duration: duration,
                                format: $("format").value, seed: 0 }).replace(/"seed":0}$/, '"seed":' + seed + "}");
  $("submit").disabled = true;
  try {
    const r = await api("/v1/jobs", { method: "POST", headers: { "Content-Type": "application/json" }, body: body });
    if (r.status !== 202) { $("error").textContent = await errorText(r); return; }
    const j = await r.json();
    show(j.id);
    refreshJobs();
  } catch (e) {
    $("error").textContent = "Request failed: " + e;
  } finally {
    $("submit").disabled = false;
  }
});

$("cancel").onclick = async () => {
  if (!current) return;
  const r = await api("/v1/jobs/" + current, { method: "DELETE" });
  if (r.status >= 400) $("error").textContent = await errorText(r);
};

function render(job) {
  $("current").style.display = "block";
  $("jobid").textContent = job.id;
  $("state").textContent = job.state;
  $("state").className = "state-" + job.state;
  const sp = job.stage_progress || {};
  $("stage").textContent = job.stage ? "· " + job.stage + (sp.total ? " " + sp.done + "/" + sp.total + " " + sp.unit : "") : "";
  $("progress").value = job.state === "done" ? 1 : (job.progress || 0);
  $("eta").textContent = job.eta_seconds != null && job.state === "running" ? "about " + Math.ceil(job.eta_seconds) + " s left (estimate)" : "";
  $("cancel").style.display = job.state === "queued" || job.state === "running" ? "inline" : "none";
  if (job.state === "failed") $("error").textContent = "Failed: " + (job.error ? job.error.message + " (" + job.error.code + ")" : "unknown error");
}

async function showResult(job) {
  const box = $("result");
  box.textContent = "";
  if (job.state !== "done") return;
  const r = await api("/v1/jobs/" + job.id + "/audio");
  if (!r.ok) { $("error").textContent = await errorText(r); return; }
  const blob = await r.blob();
  if (blobUrl) URL.revokeObjectURL(blobUrl);
  blobUrl = URL.createObjectURL(blob);
  const audio = document.createElement("audio");
  audio.id = "player"; audio.controls = true; audio.src = blobUrl;
  const a = document.createElement("a");
  a.id = "download"; a.href = blobUrl;
  const ext = (job.result && job.result.audio_file || "audio.wav").split(".").pop();
  a.download = (job.test_tone ? "mm3-test-tone-" : "mm3-") + job.id.slice(0, 12) + "." + ext;
  a.textContent = "Download " + a.download;
  const info = document.createElement("div");
  info.className = "hint";
  info.textContent = (job.test_tone ? "Synthetic test tone (fake generator), " : "") +
      job.result.audio_seconds.toFixed(2) + " s, " + job.result.frames + " frames" +
      (job.result.stopped_on_end ? ", the song ended by itself" : "") + ".";
  box.append(audio, a, info);
}

async function show(id) {
  current = id;
  $("error").textContent = "";
  $("result").textContent = "";
  if (streamAbort) streamAbort.abort();
  const r = await api("/v1/jobs/" + id);
  if (!r.ok) { $("error").textContent = await errorText(r); return; }
  const job = await r.json();
  render(job);
  if (job.state === "done" || job.state === "failed" || job.state === "cancelled") { showResult(job); return; }
  follow(id);
}

// Reads the job's Server-Sent Events with fetch (so the token can be sent).
async function follow(id) {
  const ctl = new AbortController();
  streamAbort = ctl;
  try {
    const r = await api("/v1/jobs/" + id + "/events", { signal: ctl.signal });
    if (!r.ok) { $("error").textContent = await errorText(r); return; }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
        let event = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) event = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (!data || current !== id) continue;
        const job = JSON.parse(data);
        if (event === "error") { $("error").textContent = job.error.message; continue; }
        render(job);
        if (event === "done" || event === "failed" || event === "cancelled") { await showResult(job); refreshJobs(); return; }
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") $("error").textContent = "Lost the event stream: " + e;
  }
}

async function refreshJobs() {
  try {
    const r = await api("/v1/jobs?limit=20");
    if (!r.ok) return;
    const list = (await r.json()).data;
    const tbody = $("jobs");
    tbody.textContent = "";
    for (const j of list) {
      const tr = document.createElement("tr");
      tr.className = "job"; tr.dataset.id = j.id;
      const when = new Date(j.created_at * 1000);
      const cells = [when.toLocaleString(), j.state, (j.test_tone ? "[test tone] " : "") + j.request.caption.slice(0, 80),
                     j.result ? j.result.audio_seconds.toFixed(1) + " s" : "≤ " + j.request.duration + " s"];
      cells.forEach((t, i) => { const td = document.createElement("td"); td.textContent = t; if (i === 1) td.className = "state-" + j.state; tr.append(td); });
      tr.addEventListener("click", () => show(j.id));
      tbody.append(tr);
    }
  } catch (e) {}
}

health();
refreshJobs();
setInterval(refreshJobs, 5000);
</script>
</body>
</html>
)MM3PAGE";

}  // namespace

const std::string& web_page_html() {
  static const std::string page(kPage);
  return page;
}

}  // namespace mm3::server
