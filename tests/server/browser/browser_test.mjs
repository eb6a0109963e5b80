// browser_test.mjs — a person's path through the `mm3 serve` page (issue 7), in headless chromium:
// the server runs with the fake generator (a labelled test tone) and an API key. The page must show the
// test-mode banner, ask for the key after a 401, take caption / lyrics (with a section-tag button),
// duration and a seed above 2^53, submit, show live progress from the event stream, then a playable
// audio element of the right length and a download link, and list the job among the recent ones.
// Self-terminating: a hard 120 s timer kills everything.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

const [mm3, chromiumPath] = process.argv.slice(2);
const KEY = "browser-test-key";
const BIG_SEED = "12345678901234567890";  // > 2^53: JSON.stringify would round it
const results = mkdtempSync(join(tmpdir(), "mm3_browser_test_"));
let server = null, browser = null;

function cleanup() {
  if (server && server.exitCode === null) server.kill("SIGKILL");
  rmSync(results, { recursive: true, force: true });
}
function fail(msg) {
  console.log("FAIL: " + msg);
  cleanup();
  process.exit(1);
}
const hard = setTimeout(() => fail("timed out after 120 s"), 120000);

function startServer() {
  return new Promise((resolve, reject) => {
    server = spawn(mm3, ["serve", "--fake-generator", "1.5", "--port", "0", "--results", results, "--api-key", KEY],
                   { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    server.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    server.on("exit", (code) => reject(new Error("server exited early: " + code)));
    setTimeout(() => reject(new Error("no 'listening on' line in 15 s")), 15000);
  });
}

try {
  const port = await startServer();
  const base = `http://127.0.0.1:${port}`;
  browser = await chromium.launch({
    executablePath: chromiumPath,
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  const page = await browser.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  await page.goto(base + "/", { timeout: 15000 });

  await page.waitForSelector("#banner", { state: "visible", timeout: 10000 });
  if (!(await page.textContent("#banner")).includes("test tone")) fail("banner does not say test tone");
  // The job list needs the key: the page must ask for it.
  await page.waitForSelector("#keybox", { state: "visible", timeout: 10000 });
  await page.fill("#apikey", KEY);
  await page.click("#savekey");

  await page.fill("#caption", "Genre: acoustic pop. BPM: 96.");
  await page.click("#lyrics");
  await page.click('button[data-tag="verse"]');
  await page.keyboard.type("Morning light filtering through the pine");
  const lyrics = await page.inputValue("#lyrics");
  if (!lyrics.startsWith("[verse]\nMorning light")) fail("section tag button gave " + JSON.stringify(lyrics));
  await page.fill("#duration", "2");
  await page.fill("#seed", BIG_SEED);
  await page.selectOption("#format", "wav");
  await page.click("#submit");

  // Live progress: the bar moves while the job runs (the fake job takes 1.5 s).
  await page.waitForFunction(() => {
    const p = document.getElementById("progress");
    return document.getElementById("state").textContent === "running" && p.value > 0 && p.value < 1;
  }, null, { timeout: 15000, polling: 20 });
  const jobId = (await page.textContent("#jobid")).trim();
  if (!/^[0-9a-f]{32}$/.test(jobId)) fail("job id on the page: " + jobId);

  // Done: a player whose media is the 2 s tone, and a download link.
  await page.waitForSelector("#player", { timeout: 20000 });
  const duration = await page.evaluate(() => new Promise((resolve) => {
    const a = document.getElementById("player");
    if (a.readyState >= 1) resolve(a.duration);
    a.addEventListener("loadedmetadata", () => resolve(a.duration));
    a.addEventListener("error", () => resolve(-1));
  }));
  if (!(Math.abs(duration - 2.0) < 0.05)) fail("player duration " + duration + " (want 2.0 s)");
  const dl = await page.getAttribute("#download", "download");
  if (!dl || !dl.startsWith("mm3-test-tone-") || !dl.endsWith(".wav")) fail("download name " + dl);
  if ((await page.textContent("#state")) !== "done") fail("state is not done");

  // The recent-jobs list shows it (refreshed after the terminal event).
  await page.waitForSelector(`#jobs tr[data-id="${jobId}"]`, { timeout: 10000 });

  // The seed reached the server unrounded (read the raw JSON text: JSON.parse would round it too).
  const raw = await (await fetch(`${base}/v1/jobs/${jobId}`, { headers: { Authorization: "Bearer " + KEY } })).text();
  if (!raw.includes(`"seed":${BIG_SEED}`)) fail("seed not preserved: " + raw.slice(0, 400));

  await page.screenshot({ path: join(process.env.MM3_SCREENSHOT_DIR || results, "page.png"), fullPage: true });
  if (pageErrors.length) fail("page errors: " + pageErrors.join("; "));
  await browser.close();
  browser = null;
  server.removeAllListeners("exit");
  server.kill("SIGTERM");
  clearTimeout(hard);
  console.log("PASS: browser: banner, key prompt, tag button, live progress, 2.0 s player, download, job list, big seed");
  cleanup();
  process.exit(0);
} catch (e) {
  if (browser) await browser.close().catch(() => {});
  fail(String(e && e.stack || e));
}
