#!/usr/bin/env python3
"""restart_test.py — `mm3 serve` survives kill -9 (issue 7), as a real process on loopback.

  1. serve with the fake generator (a labelled test tone, no model); finish job A;
  2. queue B and C, kill -9 the server while B runs;
  3. restart on the same results folder: A is still done and serves the same bytes (audio and codes),
     B (running at the kill) and C (queued) are reported failed with code "interrupted" — not lost;
  4. the restarted server runs a new job, and SIGTERM stops it with exit 0.

Usage: restart_test.py PATH/TO/mm3. Every wait is bounded; the server is killed on any failure.
"""
import http.client
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MM3 = sys.argv[1]
JOB = {"caption": "Genre: test", "lyrics": "[verse]\nla la", "duration": 1}


def fail(msg):
    print("FAIL: " + msg, flush=True)
    raise SystemExit(1)


class Server:
    def __init__(self, results, fake_seconds):
        self.log = open(os.path.join(results, "..", "server-%d.log" % time.monotonic_ns()), "w")
        self.p = subprocess.Popen(
            [MM3, "serve", "--fake-generator", str(fake_seconds), "--port", "0", "--results", results],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready, _, _ = select.select([self.p.stdout], [], [], 15)
        if not ready:
            self.kill()
            fail("the server printed no 'listening on' line within 15 s")
        line = self.p.stdout.readline()
        if "listening on http://127.0.0.1:" not in line:
            self.kill()
            fail("unexpected first line: %r" % line)
        self.port = int(line.split("127.0.0.1:")[1].split()[0])
        deadline = time.time() + 15
        while self.request("GET", "/health")[0] != 200:
            if time.time() > deadline:
                fail("/health never became 200")
            time.sleep(0.05)

    def request(self, method, path, body=None):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            headers = {"Content-Type": "application/json"} if body is not None else {}
            c.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
            r = c.getresponse()
            data = r.read()
            c.close()
            return r.status, data
        except OSError:
            return 0, b""

    def json(self, method, path, body=None):
        status, data = self.request(method, path, body)
        return status, (json.loads(data) if data else None)

    def wait_job(self, job_id, pred, limit=20):
        deadline = time.time() + limit
        while time.time() < deadline:
            status, j = self.json("GET", "/v1/jobs/" + job_id)
            if status == 200 and pred(j):
                return j
            time.sleep(0.05)
        fail("job %s did not reach the expected state in %d s (last: %s)" % (job_id, limit, j))

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)


def main():
    tmp = tempfile.mkdtemp(prefix="mm3_restart_test_")
    results = os.path.join(tmp, "results")
    os.makedirs(results)
    servers = []
    try:
        s = Server(results, 1.5)
        servers.append(s)
        st, a = s.json("POST", "/v1/jobs", JOB)
        if st != 202:
            fail("submit A: %s %s" % (st, a))
        a_id = a["id"]
        s.wait_job(a_id, lambda j: j["state"] == "done")
        st, a_audio = s.request("GET", "/v1/jobs/%s/audio" % a_id)
        st2, a_codes = s.request("GET", "/v1/jobs/%s/codes" % a_id)
        if st != 200 or st2 != 200 or not a_audio.startswith(b"RIFF"):
            fail("job A's audio/codes were not served before the kill (%s, %s)" % (st, st2))

        b_id = s.json("POST", "/v1/jobs", JOB)[1]["id"]
        c_id = s.json("POST", "/v1/jobs", JOB)[1]["id"]
        s.wait_job(b_id, lambda j: j["state"] == "running" and j["progress"] > 0.05)
        os.kill(s.p.pid, signal.SIGKILL)
        s.p.wait(10)
        with open(os.path.join(results, "jobs", b_id, "job.json")) as f:
            if json.load(f)["state"] != "running":
                fail("premise: after kill -9 job B's record should still say running")

        s = Server(results, 0.2)
        servers.append(s)
        j = s.wait_job(a_id, lambda j: True)
        if j["state"] != "done":
            fail("job A after restart: %s" % j["state"])
        st, audio = s.request("GET", "/v1/jobs/%s/audio" % a_id)
        if st != 200 or audio != a_audio:
            fail("job A's audio after restart differs (status %s, %d vs %d bytes)" % (st, len(audio), len(a_audio)))
        st, codes = s.request("GET", "/v1/jobs/%s/codes" % a_id)
        if st != 200 or codes != a_codes:
            fail("job A's codes after restart differ")
        for jid, what in ((b_id, "running"), (c_id, "queued")):
            j = s.wait_job(jid, lambda j: True)
            if j["state"] != "failed" or not j["error"] or j["error"]["code"] != "interrupted":
                fail("job %s (%s at the kill) after restart: %s %s" % (jid, what, j["state"], j["error"]))
            st, body = s.json("GET", "/v1/jobs/%s/audio" % jid)
            if st != 409:
                fail("audio of interrupted job %s answered %s" % (jid, st))
        st, lst = s.json("GET", "/v1/jobs")
        ids = {j["id"] for j in lst["data"]}
        if ids != {a_id, b_id, c_id}:
            fail("job list after restart: %s" % ids)
        st, metrics = s.request("GET", "/metrics")
        for line in (b'mm3_jobs{state="failed"} 2', b'mm3_jobs{state="done"} 1'):
            if line not in metrics:
                fail("metrics after restart lack %r" % line)

        st, d = s.json("POST", "/v1/jobs", JOB)
        if st != 202:
            fail("submit after restart: %s" % st)
        s.wait_job(d["id"], lambda j: j["state"] == "done")

        s.p.send_signal(signal.SIGTERM)
        try:
            rc = s.p.wait(10)
        except subprocess.TimeoutExpired:
            fail("SIGTERM did not stop the server within 10 s")
        if rc != 0:
            fail("SIGTERM exit code %s" % rc)
        print("PASS: kill -9 + restart: finished job served identically, running and queued jobs reported "
              "interrupted, new job done, SIGTERM exit 0", flush=True)
    finally:
        for srv in servers:
            srv.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
