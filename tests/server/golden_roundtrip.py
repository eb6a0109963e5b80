#!/usr/bin/env python3
"""golden_roundtrip.py — `mm3 serve` with the REAL Pipeline on the golden tiny checkpoint (issue 7).

The server must deliver exactly what the engine makes: a job's audio and codes are compared byte for
byte with `mm3 generate` on the same request (same process code path, same writer), the event stream
must show the real stages and end in "done", the codes must replay (`mm3 generate --codes`) to the same
audio, DELETE must stop a running job inside the real AR loop, and the OpenAI-style route must return
the 32 kHz rendering of the same frame budget.

Exit 77 (ctest SKIP) when the golden set is absent, or — loudly — while Pipeline::generate reports
not_implemented: this gate is NOT passed until it runs for real.

Usage: golden_roundtrip.py PATH/TO/mm3 GOLDEN_DIR
"""
import http.client
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time

MM3, GOLDEN = sys.argv[1], sys.argv[2]
CKPT = os.path.join(GOLDEN, "checkpoint")
THREADS = str(min(os.cpu_count() or 1, 2))


def skip(msg):
    print("SKIP: " + msg, flush=True)
    raise SystemExit(77)


def fail(msg):
    print("FAIL: " + msg, flush=True)
    raise SystemExit(1)


def request(port, method, path, body=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=None if body is None else json.dumps(body),
              headers={"Content-Type": "application/json"} if body is not None else {})
    r = c.getresponse()
    data = r.read()
    headers = dict(r.getheaders())
    c.close()
    return r.status, data, headers


def wav_frames(b):
    """(rate, channels, bits, frames) of a PCM WAV."""
    if b[:4] != b"RIFF" or b[8:12] != b"WAVE":
        return None
    p, fmt = 12, None
    while p + 8 <= len(b):
        cid, ln = b[p:p + 4], int.from_bytes(b[p + 4:p + 8], "little")
        if cid == b"fmt ":
            ch = int.from_bytes(b[p + 10:p + 12], "little")
            rate = int.from_bytes(b[p + 12:p + 16], "little")
            bits = int.from_bytes(b[p + 22:p + 24], "little")
            fmt = (rate, ch, bits)
        elif cid == b"data" and fmt:
            return fmt + (ln // (fmt[1] * fmt[2] // 8),)
        p += 8 + ln + (ln & 1)
    return None


def main():
    if not os.path.isfile(os.path.join(CKPT, "modular_model_index.json")):
        skip("golden checkpoint not found at %s" % CKPT)
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        manifest = json.load(f)
    cases = manifest["cases"] if isinstance(manifest, dict) and "cases" in manifest else manifest
    e2e = next(c for c in cases if c.get("kind") == "e2e")
    meta = e2e["meta"]
    job = {"caption": meta["caption"], "lyrics": meta["lyrics"], "duration": meta["audio_duration"],
           "seed": meta["seed"], "steps": meta["num_inference_steps"], "format": "wav"}
    frames = min(int(meta["audio_duration"] * 25), 9000)

    tmp = tempfile.mkdtemp(prefix="mm3_golden_roundtrip_")
    log = open(os.path.join(tmp, "server.log"), "w")
    p = subprocess.Popen([MM3, "serve", "--model", CKPT, "--port", "0", "--results", os.path.join(tmp, "results"),
                          "-t", THREADS], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        ready, _, _ = select.select([p.stdout], [], [], 60)
        if not ready:
            fail("no 'listening on' line within 60 s")
        port = int(p.stdout.readline().split("127.0.0.1:")[1].split()[0])
        deadline = time.time() + 300
        while True:
            st, body, _ = request(port, "GET", "/health")
            h = json.loads(body)
            if st == 200:
                break
            if h.get("status") == "error":
                fail("the model did not load: %s" % h["error"]["message"])
            if time.time() > deadline:
                fail("/health still %s after 300 s" % h)
            time.sleep(0.2)
        if h.get("test_tone"):
            fail("the server reports the fake generator")

        st, body, _ = request(port, "POST", "/v1/jobs", job)
        if st != 202:
            fail("submit: %s %s" % (st, body[:300]))
        job_id = json.loads(body)["id"]
        # Follow the event stream to the end (it closes after the terminal event).
        t0 = time.time()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1500)
        c.request("GET", "/v1/jobs/%s/events" % job_id)
        stream = c.getresponse().read().decode()
        c.close()
        st, body, _ = request(port, "GET", "/v1/jobs/" + job_id)
        rec = json.loads(body)
        if rec["state"] == "failed" and rec["error"]["code"] == "not_implemented":
            skip("Pipeline::generate is not implemented yet (%s): the round trip through the real pipeline "
                 "cannot run; this gate is NOT passed" % rec["error"]["message"])
        if rec["state"] != "done":
            fail("job ended %s: %s" % (rec["state"], rec["error"]))
        seconds = time.time() - t0
        for needle in ("event: progress", '"stage":"ar"', "event: done"):
            if needle not in stream:
                fail("event stream lacks %r" % needle)
        if rec["result"]["frames"] > frames or rec["result"]["frames"] < 1:
            fail("frames %s outside 1..%d" % (rec["result"]["frames"], frames))

        st, audio, hdr = request(port, "GET", "/v1/jobs/%s/audio" % job_id)
        st2, codes, _ = request(port, "GET", "/v1/jobs/%s/codes" % job_id)
        if st != 200 or st2 != 200:
            fail("audio %s / codes %s" % (st, st2))
        info = wav_frames(audio)
        if not info or info[:3] != (44100, 2, 16):
            fail("audio is not 44.1 kHz stereo 16-bit WAV: %s" % (info,))
        if "X-MM3-Test-Tone" in hdr:
            fail("real audio labelled as a test tone")

        # Same request through `mm3 generate`: the server must add nothing and lose nothing.
        req_file = os.path.join(tmp, "req.json")
        with open(req_file, "w") as f:
            json.dump(job, f)
        ref_wav, ref_codes = os.path.join(tmp, "ref.wav"), os.path.join(tmp, "ref.npy")
        r = subprocess.run([MM3, "generate", "--model", CKPT, "--request", req_file, "-o", ref_wav, "--save-codes",
                            ref_codes, "-t", THREADS, "--progress", "none"], capture_output=True, text=True, timeout=1500)
        if r.returncode != 0:
            fail("mm3 generate failed (%d): %s" % (r.returncode, r.stderr[-500:]))
        if open(ref_codes, "rb").read() != codes:
            fail("codes from the server differ from mm3 generate's")
        if open(ref_wav, "rb").read() != audio:
            fail("audio from the server differs from mm3 generate's")

        # Replay: the served codes render to the served audio.
        srv_codes, replay_wav = os.path.join(tmp, "srv.npy"), os.path.join(tmp, "replay.wav")
        open(srv_codes, "wb").write(codes)
        r = subprocess.run([MM3, "generate", "--model", CKPT, "--request", req_file, "--codes", srv_codes, "-o",
                            replay_wav, "-t", THREADS, "--progress", "none"], capture_output=True, text=True, timeout=1500)
        if r.returncode != 0:
            fail("replay failed (%d): %s" % (r.returncode, r.stderr[-500:]))
        if open(replay_wav, "rb").read() != audio:
            fail("replaying the served codes does not give the served audio")

        # Cancellation reaches the real AR loop: a long job stops within seconds of DELETE.
        long_job = dict(job, duration=60)
        st, body, _ = request(port, "POST", "/v1/jobs", long_job)
        long_id = json.loads(body)["id"]
        deadline = time.time() + 120
        while True:
            lj = json.loads(request(port, "GET", "/v1/jobs/" + long_id)[1])
            if lj["state"] == "running" and lj["stage"] == "ar" and lj["stage_progress"]["done"] >= 2:
                break
            if lj["state"] not in ("queued", "running") or time.time() > deadline:
                fail("long job never reached the AR loop: %s" % lj)
            time.sleep(0.05)
        st, body, _ = request(port, "DELETE", "/v1/jobs/" + long_id)
        if st != 202:
            fail("DELETE of the running job: %s %s" % (st, body[:200]))
        t_cancel = time.time()
        while True:
            lj = json.loads(request(port, "GET", "/v1/jobs/" + long_id)[1])
            if lj["state"] not in ("queued", "running"):
                break
            if time.time() - t_cancel > 20:
                fail("the real pipeline did not stop within 20 s of DELETE")
            time.sleep(0.05)
        if lj["state"] != "cancelled" or lj["stage_progress"]["done"] >= lj["stage_progress"]["total"]:
            fail("cancelled job: state %s at %s" % (lj["state"], lj["stage_progress"]))
        cancel_s = time.time() - t_cancel

        # OpenAI-style route, synchronous, 32 kHz.
        st, sp, hdr = request(port, "POST", "/v1/audio/speech",
                              {"input": meta["lyrics"], "instructions": meta["caption"], "seed": meta["seed"],
                               "max_new_tokens": frames}, timeout=1500)
        if st != 200:
            fail("/v1/audio/speech: %s %s" % (st, sp[:300]))
        sinfo = wav_frames(sp)
        if not sinfo or sinfo[:3] != (32000, 2, 16):
            fail("/v1/audio/speech is not 32 kHz stereo 16-bit WAV: %s" % (sinfo,))
        st, body, _ = request(port, "GET", "/v1/jobs/" + hdr["X-Job-Id"])
        sp_rec = json.loads(body)
        if sp_rec["result"]["frames"] != rec["result"]["frames"]:
            fail("speech route made %s frames, the job %s" % (sp_rec["result"]["frames"], rec["result"]["frames"]))
        st, metrics, _ = request(port, "GET", "/metrics")
        if b'mm3_jobs{state="done"} 2' not in metrics or b'mm3_jobs{state="cancelled"} 1' not in metrics:
            fail("metrics: %s" % metrics.decode()[:800])
        # The byte comparisons above are only as strong as the audio is non-trivial: say so when it is silent
        # (v1's golden vocoder holds NaN weights, so its audio is all zeros; the codes comparison still bites).
        data_at = audio.find(b"data") + 8
        samples = memoryview(audio[data_at:data_at + (len(audio) - data_at) // 2 * 2]).cast("h")
        peak = max((abs(x) for x in samples), default=0)
        note = "" if peak else " (NOTE: the audio is silent, so only its length and header were really compared)"
        print("PASS: real pipeline round trip (job %.1f s, %d frames): events, audio and codes identical to "
              "mm3 generate, replay identical, cancel stopped the AR loop in %.1f s, speech route 32 kHz; "
              "audio peak %d/32767%s" % (seconds, rec["result"]["frames"], cancel_s, peak, note), flush=True)
    finally:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
