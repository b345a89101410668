#!/usr/bin/env python3
"""Runs every test binary of the workspace, TEST_JOBS at a time (4 by default), then the doc tests.

`make test` calls it. One `cargo test --no-run` builds every test binary; each then runs as cargo
would run it (in its package's directory, with its package's CARGO_* variables), its output kept
apart and printed whole, after a cargo-style `Running` line, when it ends. Binaries that start a
real worker node, a Docker engine or Kueue hold host-wide resources (network namespaces,
iptables, cgroups, a mount namespace) and both cores: they run alone (EXCLUSIVE). The others run
side by side, the longest first by the durations of the last run (kept in
~/.cache/neocloud-testenv/test-durations.json; a new machine runs them in cargo's order).

Every binary runs even after a failure (as `--no-fail-fast`). A binary still running after
TEST_TIMEOUT seconds (1800) is killed with its process group and counts as failed. Exit status:
0 when every binary passed, 101 otherwise, as cargo's.

Arguments are passed to `cargo test` (for example `-p neocloud-node`, or `--workspace --test '*'`
for the integration test binaries only).

TEST_REPEAT=N runs the whole set N times, round after round from one build, then prints a table
of each binary's passes and its shortest and longest run (kept in target/test-rounds.md too): the
way to find flaky binaries. The doc tests run once, in the first round only.
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# (package, test target): they start a real worker node, a Docker engine or Kueue.
EXCLUSIVE = {
    ("neocloud-node", "in_cluster"),
    ("neocloud-node", "serving"),
    ("neocloud-node", "kueue_admission"),
    ("neocloud-node", "runner"),
    ("neocloud-testenv", "worker"),
    ("neocloud-testenv", "docker"),
    ("neocloud-testenv", "kueue"),
}

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "neocloud-testenv"
DURATIONS = CACHE / "test-durations.json"


def build(cargo, args):
    """Builds the test binaries and returns them as dicts (package, name, kind, exe, dir, src)."""
    cmd = [cargo, "test", "--no-run", "--message-format=json-render-diagnostics", *args]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    binaries = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        if not set(target["kind"]) & {"lib", "bin", "test", "proc-macro"}:
            continue
        manifest = Path(msg["manifest_path"])
        package = msg["package_id"]
        binaries.append(
            {
                "package": package_name(package, manifest),
                "name": target["name"],
                "exe": msg["executable"],
                "dir": str(manifest.parent),
                "src": target["src_path"],
            }
        )
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    return binaries


def package_name(package_id, manifest):
    """The package's name: `path+file:///…/host/node#neocloud-node@0.1.0` (cargo 1.77+)."""
    if "#" in package_id:
        tail = package_id.rsplit("#", 1)[1]
        return tail.split("@", 1)[0] if "@" in tail else manifest.parent.name
    return package_id.split(" ", 1)[0]


def key(b):
    return f"{b['package']}/{b['name']}"


def run_one(b, timeout, results, lock, out):
    env = dict(os.environ)
    env["CARGO_MANIFEST_DIR"] = b["dir"]
    env["CARGO_PKG_NAME"] = b["package"]
    with tempfile.TemporaryFile(mode="w+") as log:
        started = time.monotonic()
        proc = subprocess.Popen(
            [b["exe"]],
            cwd=b["dir"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with lock:
            RUNNING[proc.pid] = proc
        try:
            code = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code = proc.wait()
            timed_out = True
        finally:
            with lock:
                RUNNING.pop(proc.pid, None)
        took = time.monotonic() - started
        log.seek(0)
        text = log.read()
    with lock:
        rel = os.path.relpath(b["src"], b["dir"])
        out.write(f"     Running {rel} ({os.path.relpath(b['exe'])}) [{b['package']}]\n")
        out.write(text)
        if timed_out:
            out.write(f"\n{key(b)}: killed after {timeout} s (TEST_TIMEOUT)\n")
        ok = code == 0 and not timed_out
        out.write(f"== {key(b)}: {'ok' if ok else 'FAILED'} in {took:.1f} s\n\n")
        out.flush()
        results[key(b)] = (ok, took)


RUNNING = {}


def main():
    args = sys.argv[1:]
    cargo = os.environ.get("CARGO", "cargo")
    jobs = max(1, int(os.environ.get("TEST_JOBS", "4")))
    timeout = int(os.environ.get("TEST_TIMEOUT", "1800"))
    started = time.monotonic()
    binaries = build(cargo, args)
    try:
        known = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        known = {}
    order = sorted(binaries, key=lambda b: -known.get(key(b), 0.0))
    alone = [b for b in order if (b["package"], b["name"]) in EXCLUSIVE]
    shared = [b for b in order if (b["package"], b["name"]) not in EXCLUSIVE]
    print(
        f"run-tests: {len(binaries)} test binaries, {len(shared)} {jobs} at a time, "
        f"then {len(alone)} alone",
        flush=True,
    )

    repeat = max(1, int(os.environ.get("TEST_REPEAT", "1")))
    rounds = []
    for n in range(1, repeat + 1):
        if repeat > 1:
            print(f"run-tests: round {n} of {repeat}", flush=True)
        rounds.append(run_round(cargo, args, jobs, timeout, shared, alone, doc=n == 1))
        try:
            CACHE.mkdir(parents=True, exist_ok=True)
            known.update({k: took for k, (ok, took) in rounds[-1].items() if k != "doc tests"})
            DURATIONS.write_text(json.dumps(known, indent=1, sort_keys=True))
        except OSError as e:
            print(f"run-tests: cannot keep the durations: {e}", file=sys.stderr)

    failed = sorted({k for r in rounds for k, (ok, _) in r.items() if not ok})
    wall = time.monotonic() - started
    busy = sum(took for r in rounds for _, took in r.values())
    if repeat > 1:
        table = rounds_table(rounds)
        print(table)
        try:
            Path("target").mkdir(exist_ok=True)
            Path("target/test-rounds.md").write_text(table)
        except OSError as e:
            print(f"run-tests: cannot write target/test-rounds.md: {e}", file=sys.stderr)
    total = sum(len(r) for r in rounds)
    bad = sum(1 for r in rounds for ok, _ in r.values() if not ok)
    print(
        f"run-tests: {total - bad} of {total} passed in {wall:.0f} s "
        f"(the binaries' own times add up to {busy:.0f} s)"
    )
    for k in failed:
        print(f"run-tests: FAILED {k}")
    return 101 if failed else 0


def rounds_table(rounds):
    """A Markdown table: each binary, its passes out of its runs, its shortest and longest run."""
    lines = ["| test binary | passed | shortest | longest |", "| --- | --- | --- | --- |"]
    for k in sorted({k for r in rounds for k in r if k != "doc tests"}):
        runs = [r[k] for r in rounds if k in r]
        times = [took for _, took in runs]
        passed = sum(1 for ok, _ in runs if ok)
        fails = [str(i + 1) for i, r in enumerate(rounds) if k in r and not r[k][0]]
        note = f" (failed in round {', '.join(fails)})" if fails else ""
        lines.append(
            f"| {k} | {passed} of {len(runs)}{note} | {min(times):.1f} s | {max(times):.1f} s |"
        )
    return "\n".join(lines) + "\n"


def run_round(cargo, args, jobs, timeout, shared, alone, doc):
    """Runs every binary once (the shared ones `jobs` at a time, then the others alone), and the
    doc tests when `doc`; returns {binary: (passed, seconds)}."""
    results, lock, out = {}, threading.Lock(), sys.stdout
    cpu = cpu_times()

    def worker(queue):
        while True:
            with lock:
                if not queue:
                    return
                b = queue.pop(0)
            run_one(b, timeout, results, lock, out)

    def interrupted(signum, _frame):
        with lock:
            for proc in RUNNING.values():
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        sys.exit(128 + signum)

    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)

    queue = list(shared)
    threads = [threading.Thread(target=worker, args=(queue,)) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for b in alone:
        run_one(b, timeout, results, lock, out)

    # Doc tests: rustdoc builds and runs them; nothing else runs beside.
    # `cargo test --doc` refuses other target selections (`--test '*'`): no doc tests then.
    targeted = any(a in ("--test", "--tests", "--lib", "--bins") or a.startswith("--test=") for a in args)
    if doc and not targeted:
        started = time.monotonic()
        code = subprocess.run([cargo, "test", "--doc", "--no-fail-fast", *args]).returncode
        results["doc tests"] = (code == 0, time.monotonic() - started)
        print(f"== doc tests: {'ok' if code == 0 else 'FAILED'} in {results['doc tests'][1]:.1f} s")
    busy = cpu_since(cpu)
    print(f"run-tests: the machine's cores were {busy:.0f} % busy over the round (/proc/stat)", flush=True)
    return results


def cpu_times():
    """(busy, total) jiffies of every core since boot, from /proc/stat; (0, 0) where unreadable."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return (0, 0)
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields) - idle, sum(fields))


def cpu_since(before):
    """The share of the cores that was busy since `before` (cpu_times()), as a percentage."""
    after = cpu_times()
    total = after[1] - before[1]
    return 100.0 * (after[0] - before[0]) / total if total > 0 else 0.0


if __name__ == "__main__":
    sys.exit(main())
