"""Unit tests of the pure parts: no root, cgroup, sshd or second user (``pytest -m "not system"``).

The dispatcher judges hand-built reports (the dicts ``dispatch.local.report`` produces); ``ssh.classify``
reads ssh's own stderr as OpenSSH 9.2 prints it; the wire format is fed through ``FrameReader`` at
every byte boundary. What these cover end to end (real hosts, real ssh) stays in the system tests.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from dispatch.agent import frames
from dispatch.core.configfile import make_host
from dispatch.core.errors import (
    HostKeyError,
    OverPeerCapError,
    PeerAuthError,
    PeerUnreachableError,
    UsageError,
)
from dispatch.core.exitcodes import ExitCode
from dispatch.core.settings import HostSettings, Settings
from dispatch.core.text import check_name, storable
from dispatch.core.units import GiB, MiB, format_duration, parse_duration, parse_size
from dispatch.guards.longjob import KEYS, from_headers, missing, parse_spec
from dispatch.hosts.judgement import HostPending
from dispatch.hosts.kinds import host_for
from dispatch.hosts.ssh import transport as ssh
from dispatch.hosts.ssh.keys import SPEC as SSH_KIND
from dispatch.hosts.ssh.peers import choose_peer, effective_cap
from dispatch.placement import auto
from dispatch.placement.dispatcher import Decision, Job, decide, judge
from dispatch.placement.reports import HostReading
from tests.conftest import wait_for

PEER = "peer1"


# ------------------------------------------------------------------------------------- dispatcher
def settings(across: bool = True, peer_memory_cap: int | None = None, threshold: float = 7200.0,
             tmp: Path | None = None) -> Settings:
    hosts = {"local": HostSettings("local"),
             PEER: make_host(PEER, SSH_KIND, ssh="peer1.example", peer_memory_cap=peer_memory_cap)}
    return Settings(state_dir=str(tmp or "/nonexistent/hostrun-state"), hosts=hosts,
                    enable_across_machines=across, long_job_threshold=threshold)


def reading(host: str, free: int, limit: int = 8 * GiB, queued: int = 0, default_cap: int | None = None,
            gpus: list[dict[str, Any]] | None = None, peak: dict[str, Any] | None = None) -> HostReading:
    """A host's report as ``dispatch.local.report`` builds it, reduced to what the dispatcher reads."""
    report = {"slice": {"limit": limit, "free": free, "queued": queued},
              "settings": {"default_cap": default_cap, "gamble_size": 512 * MiB},
              "label_peak": peak, "gpus": gpus or []}
    return HostReading(host, report, None, 0.01)


def peak_row(max_peak: int, max_duration: float | None = None, host: str = "local") -> dict[str, Any]:
    return {"label": "job", "host": host, "max_peak": max_peak, "runs": 3, "last_peak": max_peak,
            "hit_ceiling": False, "last_duration": max_duration, "max_duration": max_duration,
            "updated": 0.0}


NONE_PENDING: dict[str, HostPending] = {}


@pytest.mark.parametrize(("case", "job", "local", "peer", "pending", "expected"), [
    ("fits local", Job("job", cap=GiB), reading("local", 4 * GiB), reading(PEER, 8 * GiB), NONE_PENDING,
     ("local", "local", 0, "local fits: cap booking 1.0 GiB, 4.0 GiB free")),
    ("prefers local even when the peer has more room", Job("job", cap=GiB), reading("local", 2 * GiB),
     reading(PEER, 64 * GiB, limit=64 * GiB), NONE_PENDING,
     ("local", "local", 0, "local fits: cap booking 1.0 GiB, 2.0 GiB free")),
    ("peer when local is full", Job("job", cap=GiB), reading("local", 512 * MiB), reading(PEER, 8 * GiB),
     NONE_PENDING, ("peer", PEER, 0, "local does not fit; peer1 fits: cap booking 1.0 GiB, 8.0 GiB free")),
    ("queued jobs count as taken", Job("job", cap=GiB), reading("local", 4 * GiB, queued=7 * GiB // 2),
     reading(PEER, 8 * GiB), NONE_PENDING,
     ("peer", PEER, 0, "local does not fit; peer1 fits: cap booking 1.0 GiB, 8.0 GiB free")),
    ("queue locally when nothing fits now", Job("job", cap=GiB), reading("local", 0),
     reading(PEER, 256 * MiB), NONE_PENDING,
     ("queue", "local", 0, "no host fits now: wait in the local queue")),
    ("pending bookings are subtracted", Job("job", cap=GiB), reading("local", 4 * GiB),
     reading(PEER, 8 * GiB), {"local": HostPending(7 * GiB // 2, {}, ())},
     ("peer", PEER, 0, "local does not fit; peer1 fits: cap booking 1.0 GiB, 8.0 GiB free")),
    ("only the peer could ever hold it", Job("job", cap=12 * GiB), reading("local", 8 * GiB),
     reading(PEER, 0, limit=16 * GiB), NONE_PENDING,
     ("peer", PEER, 0, "only peer1 could ever hold it: wait in its queue")),
    ("larger than every slice: never fits (243)", Job("job", cap=32 * GiB), reading("local", 8 * GiB),
     reading(PEER, 8 * GiB), NONE_PENDING,
     ("refuse", None, ExitCode.NEVER_FITS, "no host could ever run it")),
    ("a peak booking: the recorded peak, not the gamble size", Job("job"),
     reading("local", 400 * MiB, peak=peak_row(300 * MiB)), reading(PEER, 8 * GiB), NONE_PENDING,
     ("local", "local", 0, "local fits: peak booking 300 MiB, 400 MiB free")),
    ("no history, no cap: a gamble booking", Job("job"), reading("local", 400 * MiB),
     reading(PEER, 8 * GiB), NONE_PENDING,
     ("peer", PEER, 0, "local does not fit; peer1 fits: gamble booking 512 MiB, 8.0 GiB free")),
])
def test_decide(case: str, job: Job, local: HostReading, peer: HostReading,
                pending: dict[str, HostPending], expected: tuple[str, str | None, int, str]) -> None:
    decision = decide(settings(), job, [local, peer], pending)
    assert (decision.action, decision.host, decision.exit_code, decision.reasons[-1]) == expected, case


def test_pending_is_named_in_the_reason() -> None:
    verdict = judge(host_for(settings(), "local"), Job("job", cap=GiB), reading("local", 4 * GiB),
                    HostPending(7 * GiB // 2, {}, ()))
    assert (verdict.fits, verdict.could_ever_fit, verdict.need, verdict.free) == (False, True, GiB, GiB // 2)
    assert verdict.reason == "full: needs 1.0 GiB, 512 MiB free (after 3.5 GiB pending)"


def test_an_unreadable_host_is_judged_as_such() -> None:
    verdict = judge(host_for(settings(), PEER), Job("job", cap=GiB),
                    HostReading(PEER, None, "connection refused", 0.1))
    assert verdict == (PEER, False, False, None, None, "could not read: connection refused", None, False)


def test_across_disabled_leaves_the_peers_out() -> None:
    decision = decide(settings(across=False), Job("job", cap=GiB),
                      [reading("local", 0), reading(PEER, 8 * GiB)], NONE_PENDING)
    assert decision.reasons == ["peers not considered: enable_across_machines is off",
                                "no host fits now: wait in the local queue"]
    assert [j.host for j in decision.judgements] == ["local"]
    assert (decision.action, decision.host) == ("queue", "local")


def test_peer_memory_cap_bounds_what_the_peer_is_judged_for() -> None:
    s = settings(peer_memory_cap=2 * GiB)
    over = judge(host_for(s, PEER), Job("job", cap=4 * GiB), reading(PEER, 8 * GiB))
    assert (over.fits, over.could_ever_fit) == (False, False)
    assert over.reason == "cap 4.0 GiB exceeds its peer_memory_cap (2.0 GiB)"
    # sent uncapped: runs under that cap
    uncapped = judge(host_for(s, PEER), Job("job"), reading(PEER, 8 * GiB))
    assert (uncapped.fits, uncapped.need) == (True, 2 * GiB)
    assert uncapped.reason == "fits: cap booking 2.0 GiB, 8.0 GiB free"
    # local is not bound by it
    local = judge(host_for(s, "local"), Job("job", cap=4 * GiB), reading("local", 8 * GiB))
    assert local.fits


@pytest.mark.parametrize(("cap", "peer_memory_cap", "effective", "refused"), [
    (None, None, None, False),
    (None, 2 * GiB, 2 * GiB, False),
    (2 * GiB, 2 * GiB, 2 * GiB, False),
    (2 * GiB + 1, 2 * GiB, 2 * GiB + 1, True),
])
def test_choose_peer_refuses_a_cap_over_peer_memory_cap_249(cap: int | None, peer_memory_cap: int | None,
                                                            effective: int | None, refused: bool) -> None:
    s = settings(peer_memory_cap=peer_memory_cap)
    assert effective_cap(host_for(s, PEER), cap) == effective
    if not refused:
        assert choose_peer(s, True, cap).name == PEER
        return
    with pytest.raises(OverPeerCapError) as caught:
        choose_peer(s, PEER, cap)
    assert caught.value.exit_code == ExitCode.OVER_PEER_CAP == 249
    assert str(caught.value) == "--peer=peer1: cap 2.0 GiB exceeds its peer_memory_cap (2.0 GiB)"


def test_choose_peer_names_the_configured_peers() -> None:
    with pytest.raises(UsageError, match=r"^--peer=nope: no such peer \(configured: peer1\)$"):
        choose_peer(settings(), "nope", None)


GPUS = [{"index": 0, "free": 8 * GiB, "total": 16 * GiB}, {"index": 1, "free": 10 * GiB, "total": 16 * GiB}]


@pytest.mark.parametrize(("gpu_memory", "pending", "fits", "gpu_index", "reason"), [
    (6 * GiB, HostPending(0, {}, ()), True, 1, "fits: cap booking 1.0 GiB, 8.0 GiB free"),
    (6 * GiB, HostPending(0, {1: 4 * GiB}, ()), True, 0, "fits: cap booking 1.0 GiB, 8.0 GiB free"),
    (9 * GiB, HostPending(0, {1: 4 * GiB}, ()), False, 0,
     "needs 9.0 GiB VRAM, most free on a GPU 8.0 GiB after pending"),
    (9 * GiB, HostPending(0, {}, (3 * GiB,)), False, 0,  # unplaced: on the GPU with the most left
     "needs 9.0 GiB VRAM, most free on a GPU 8.0 GiB after pending"),
    (10 * GiB, HostPending(0, {}, ()), True, 1, "fits: cap booking 1.0 GiB, 8.0 GiB free"),
])
def test_vram_after_pending(gpu_memory: int, pending: HostPending, fits: bool, gpu_index: int,
                            reason: str) -> None:
    verdict = judge(host_for(settings(), "local"), Job("job", cap=GiB, gpu_memory=gpu_memory),
                    reading("local", 8 * GiB, gpus=GPUS), pending)
    assert (verdict.fits, verdict.could_ever_fit, verdict.gpu_index, verdict.reason) == (
        fits, True, gpu_index, reason)


def test_vram_no_gpu_and_never_enough() -> None:
    here = host_for(settings(), "local")
    none = judge(here, Job("job", cap=GiB, gpu_memory=GiB), reading("local", 8 * GiB))
    assert (none.fits, none.could_ever_fit, none.reason) == (False, False, "no GPU")
    huge = judge(here, Job("job", cap=GiB, gpu_memory=20 * GiB), reading("local", 8 * GiB, gpus=GPUS))
    assert (huge.fits, huge.could_ever_fit) == (False, False)
    assert huge.reason == "needs 20.0 GiB VRAM, most free on a GPU 10.0 GiB"


DECLARATION = ["sharded: one shard per crate", "resumable: checkpoints in target/ckpt",
               "multi-host: shards go to peer1 with --peer"]  # a script's three ``# long-job:`` lines


@pytest.mark.parametrize(("job", "peak", "refused", "first", "lacks"), [
    (Job("job", cap=GiB, expect_duration=3 * 3600.0), None, True, "expected duration 3.0 h (declared)",
     "sharded, resumable, multi-host"),
    (Job("job", cap=GiB), peak_row(GiB // 2, max_duration=5 * 3600.0, host=PEER), True,
     "expected duration 5.0 h (recorded on peer1)", "sharded, resumable, multi-host"),
    (Job("job", cap=GiB, expect_duration=3 * 3600.0, long_job=("sharded",)), None, True,
     "expected duration 3.0 h (declared)", "resumable, multi-host"),
    (Job("job", cap=GiB, expect_duration=3 * 3600.0, long_job=tuple(from_headers(DECLARATION))), None,
     False, "expected duration 3.0 h (declared)", None),
    (Job("job", cap=GiB, expect_duration=7200.0), None, False, "expected duration 2.0 h (declared)", None),
])
def test_long_job_rule_244(job: Job, peak: dict[str, Any] | None, refused: bool, first: str,
                           lacks: str | None) -> None:
    decision = decide(settings(), job, [reading("local", 4 * GiB), reading(PEER, 8 * GiB, peak=peak)],
                      NONE_PENDING)
    assert decision.reasons[0] == first
    if not refused:
        assert (decision.action, decision.exit_code) == ("local", 0)
        return
    assert (decision.action, decision.host, decision.exit_code) == ("refuse", None, 244)
    assert decision.exit_code == ExitCode.LONG_SINGLE_HOST and decision.judgements == []
    assert decision.reasons[1].startswith(
        f"longer than 2.0 h on one host: its long-job declaration lacks {lacks} (say how")


def test_decision_as_dict_carries_the_judgements() -> None:
    decision = decide(settings(), Job("job", cap=GiB), [reading("local", 4 * GiB)], NONE_PENDING)
    assert isinstance(decision, Decision)
    data = decision.as_dict()
    assert data["action"] == "local"
    assert data["judgements"][0]["host"] == "local" and data["judgements"][0]["need"] == GiB


def test_queue_then_alert_when_a_peer_could_take_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local is full, so the job queues there; the watch then reads the peer (through a fake
    ``read_reports``, in place of ssh) and raises one alert with the exact command to move it."""
    s = settings(tmp=tmp_path)
    job = Job("build", cap=GiB)
    decision = decide(s, job, [reading("local", 0), reading(PEER, 0)], NONE_PENDING)
    assert (decision.action, decision.host) == ("queue", "local")
    asked: list[list[str]] = []

    def fake_reports(_settings: Settings, names: list[str], label: str | None) -> list[HostReading]:
        asked.append(names)
        return [reading(PEER, 4 * GiB)]

    monkeypatch.setattr(auto, "read_reports", fake_reports)
    monkeypatch.setattr(auto, "pending_after", lambda *_: {})
    said: list[str] = []
    watch = auto.PeerWatch(s, job, ["-m", "1G", "--auto"], ["make", "-j8"], said.append)
    watch(None)  # the admission loop's call while the job waits: reads in a background thread
    wait_for(lambda: said and watch._busy.acquire(blocking=False))
    watch._busy.release()
    watch(None)  # once per wait: no second reading, no second alert
    assert asked == [[PEER]]
    move = "hostrun -m 1G --peer=peer1 -- make -j8"
    assert said == [f"alert: job build waits on local; peer1 could take it now "
                    f"(free 4.0 GiB, need 1.0 GiB): {move}"]
    from dispatch.placement.alerts import read_all

    (alert,) = read_all(s.alerts_path)
    assert (alert["kind"], alert["host"], alert["peer"], alert["need"], alert["action"],
            alert["command"]) == ("peer-could-take", "local", PEER, GiB, move, "make -j8")


def test_peer_flag_with_across_disabled_is_248(tmp_path: Path) -> None:
    """The 248 rule lives in the CLI: refused before any cgroup, ssh or booking."""
    import subprocess
    import sys

    config = tmp_path / "hosts.toml"
    config.write_text(f'state_dir = "{tmp_path / "state"}"\n[hosts.local]\nslice = "1G"\n'
                      '[hosts.peer1]\nssh = "peer1.invalid"\n')
    proc = subprocess.run([sys.executable, "-m", "dispatch", "--config", str(config), "--peer", "--",
                           "true"], capture_output=True, text=True, timeout=60, check=False,
                          env={**os.environ, "ENABLE_ACROSS_MACHINES": "0"})
    assert proc.returncode == ExitCode.ACROSS_DISABLED == 248
    assert proc.stderr == ("hostrun: error: --peer: enable_across_machines is off (set it in the config "
                           "or ENABLE_ACROSS_MACHINES=1); not running locally instead\n")


# ------------------------------------------------------------------------------------ ssh.classify
BANNER = "@" * 59
CHANGED = f"""{BANNER}
@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @
{BANNER}
IT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!
Someone could be eavesdropping on you right now (man-in-the-middle attack)!
It is also possible that a host key has just been changed.
The fingerprint for the ED25519 key sent by the remote host is
SHA256:3u5PCnD7UQnBp0Lk0PqGJ8S6dJz2v9kX5bYyq1S5x0E.
Please contact your system administrator.
Add correct host key in /root/.ssh/known_hosts to get rid of this message.
Offending ED25519 key in /root/.ssh/known_hosts:3
Host key for [127.0.0.2]:2222 has changed and you have requested strict checking.
Host key verification failed.
"""
# ssh's stderr with BatchMode=yes (OpenSSH 9.2); the refused, resolve and timeout texts recorded here.
SSH_STDERR = [
    ("refused", "ssh: connect to host 127.0.0.1 port 1: Connection refused\n", PeerUnreachableError, True,
     "peer peer1: ssh: connect to host 127.0.0.1 port 1: Connection refused"),
    ("timed out", "Connection timed out during banner exchange\n"
     "Connection to 10.255.255.1 port 22 timed out\n", PeerUnreachableError, True,
     "peer peer1: Connection to 10.255.255.1 port 22 timed out"),
    ("host key changed", CHANGED, HostKeyError, False,
     "peer peer1: host key not known or changed (Host key verification failed.); check it and add it "
     "to known_hosts yourself: hostrun never skips the check"),
    ("unknown host key", "No ED25519 host key is known for [127.0.0.2]:2222 and you have requested "
     "strict checking.\r\nHost key verification failed.\r\n", HostKeyError, False,
     "peer peer1: host key not known or changed (Host key verification failed.); check it and add it "
     "to known_hosts yourself: hostrun never skips the check"),
    ("permission denied", "hostrun@127.0.0.2: Permission denied (publickey,password).\n", PeerAuthError,
     False, "peer peer1: authentication failed (hostrun@127.0.0.2: Permission denied (publickey,password).)"),
    ("resolve failure", "ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known\n",
     PeerUnreachableError, False,
     "peer peer1: ssh: Could not resolve hostname nosuchhost.invalid: Name or service not known"),
    ("master gone", "mux_client_request_session: read from master failed: Broken pipe\n",
     PeerUnreachableError, True, "peer peer1: mux_client_request_session: read from master failed: "
     "Broken pipe"),
    ("no message", "", PeerUnreachableError, False, "peer peer1: ssh failed without a message"),
]


@pytest.mark.parametrize(("case", "stderr", "kind", "transient", "message"), SSH_STDERR,
                         ids=[c[0] for c in SSH_STDERR])
def test_classify(case: str, stderr: str, kind: type[Exception], transient: bool, message: str) -> None:
    error = ssh.classify(PEER, stderr)
    assert type(error) is kind
    assert str(error) == message
    assert ssh.is_transient(error) is transient
    assert isinstance(error, PeerUnreachableError)  # every kind exits 246
    assert error.exit_code == ExitCode.PEER_UNREACHABLE == 246


def test_backoff_stays_within_the_cap_and_the_deadline() -> None:
    import time

    for attempt in range(1, 8):
        assert 0 <= ssh.backoff(attempt) <= min(ssh.BACKOFF_CAP, ssh.BACKOFF_BASE * 2 ** attempt)
    assert ssh.backoff(5, deadline=time.monotonic() - 1) == 0.0


def test_retry_transient_retries_weather_not_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one retry rule (an ssh command's and a peer session's): transient failures are tried
    again at most ``retries`` times and never past the deadline; others are raised at once."""
    import time

    monkeypatch.setattr(ssh.time, "sleep", lambda _s: None)
    calls: list[int] = []

    def failing(error: PeerUnreachableError) -> Any:
        def attempt() -> None:
            calls.append(1)
            raise error
        return attempt

    refused = PeerUnreachableError("peer p: Connection refused", transient=True)
    with pytest.raises(PeerUnreachableError):
        ssh.retry_transient(failing(refused), None, retries=3)
    assert len(calls) == 4
    calls.clear()
    with pytest.raises(PeerUnreachableError):
        ssh.retry_transient(failing(PeerUnreachableError("peer p: no such host")), None)
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(PeerUnreachableError):
        ssh.retry_transient(failing(refused), time.monotonic() - 1)
    assert len(calls) == 1
    answers = iter([refused, None])

    def flaky() -> str:
        error = next(answers)
        if error is not None:
            raise error
        return "ok"
    assert ssh.retry_transient(flaky, None) == "ok"


# ------------------------------------------------------------------------------------------- frames
STREAM = [(b"M", b"hostrun: waiting for 1.0 GiB"), (b"O", b"out\x00\xff"), (b"E", b""),
          (b"R", b'{"exit_code": 0}')]
WIRE = b"".join(frames.encode(kind, payload) for kind, payload in STREAM)


def test_encode_is_type_length_payload() -> None:
    assert frames.encode(b"O", b"hi") == b"O\x00\x00\x00\x02hi"
    assert frames.encode(b"Z") == b"Z\x00\x00\x00\x00"


def test_reader_splits_at_every_byte_boundary() -> None:
    for cut in range(len(WIRE) + 1):
        reader = frames.FrameReader()
        got = reader.feed(WIRE[:cut]) + reader.feed(WIRE[cut:])
        assert got == STREAM, cut
        assert reader.pending == 0


def test_reader_byte_by_byte_and_partial_state() -> None:
    reader = frames.FrameReader()
    got = []
    for i in range(len(WIRE)):
        got += reader.feed(WIRE[i:i + 1])
    assert got == STREAM
    assert reader.feed(frames.encode(b"O", b"abc")[:6]) == []
    assert reader.pending == 6


def test_reader_takes_the_largest_frame_and_rejects_one_byte_more() -> None:
    big = b"x" * frames.MAX_PAYLOAD
    assert frames.FrameReader().feed(frames.encode(b"O", big)) == [(b"O", big)]
    with pytest.raises(ValueError, match=r"^frame of 1048577 bytes: not a hostrun agent stream$"):
        frames.FrameReader().feed(frames.HEADER.pack(b"O", frames.MAX_PAYLOAD + 1))


@pytest.mark.parametrize("garbage", [b"bash: python3: command not found\n",
                                     b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"])
def test_reader_rejects_what_is_not_an_agent_stream(garbage: bytes) -> None:
    with pytest.raises(ValueError, match="not a hostrun agent stream"):
        frames.FrameReader().feed(garbage)


def test_writer_and_read_spec_round_trip_over_a_pipe() -> None:
    read_fd, write_fd = os.pipe()
    try:
        writer = frames.FrameWriter(write_fd)
        writer.send(frames.Frame.SPEC, b'{"argv": ["make"]}')
        writer.send(b"H")
        writer.send(b"S", b"15")
        assert frames.read_spec(read_fd) == b'{"argv": ["make"]}'
        assert frames.FrameReader().feed(os.read(read_fd, 100)) == [(b"H", b""), (b"S", b"15")]
        writer.send(b"O", b"x")
        with pytest.raises(ValueError, match=r"^expected the spec frame, got b'O' of 1 bytes$"):
            frames.read_spec(read_fd)
    finally:
        os.close(write_fd)
    try:
        with pytest.raises(EOFError, match="before sending the spec"):
            frames.read_spec(read_fd)
    finally:
        os.close(read_fd)


# ---------------------------------------------------------------------------- longjob, units, text
@pytest.mark.parametrize(("spec", "answers"), [
    ("sharded=by crate;resumable=checkpoints;multi-host=two peers",
     {"sharded": "by crate", "resumable": "checkpoints", "multi-host": "two peers"}),
    ("Sharded: a=b ; resumable = yes: from ckpt", {"sharded": "a=b", "resumable": "yes: from ckpt"}),
    ("sharded=x\nmulti-host=y\n\n", {"sharded": "x", "multi-host": "y"}),
    ("long-job: resumable: yes", {"resumable": "yes"}),
    ("", {}),
])
def test_parse_spec(spec: str, answers: dict[str, str]) -> None:
    assert parse_spec(spec) == answers


@pytest.mark.parametrize(("spec", "message"), [
    ("shardd=x", "--long-job: 'shardd=x' is not one of sharded=HOW, resumable=HOW, multi-host=HOW"),
    ("sharded", "--long-job: 'sharded' is not one of sharded=HOW, resumable=HOW, multi-host=HOW"),
    ("sharded=  ;resumable=y", "--long-job: sharded has no answer (say how)"),
])
def test_parse_spec_refuses_typos_and_empty_answers(spec: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_spec(spec)
    assert str(caught.value) == message and caught.value.exit_code == ExitCode.USAGE


def test_parse_spec_from_a_file_of_header_lines(tmp_path: Path) -> None:
    path = tmp_path / "long-job.txt"
    path.write_text("#!/bin/sh\n# a comment\n" + "".join(f"# long-job: {line}\n" for line in DECLARATION)
                    + "resumable=keeps; its semicolon\n")
    assert parse_spec(f"@{path}") == {"sharded": "one shard per crate",
                                      "resumable": "keeps; its semicolon",
                                      "multi-host": "shards go to peer1 with --peer"}
    with pytest.raises(UsageError, match=r"^--long-job: cannot read .*/absent: No such file or directory$"):
        parse_spec(f"@{tmp_path / 'absent'}")


def test_headers_and_missing() -> None:
    assert from_headers(DECLARATION) == {"sharded": "one shard per crate",
                                         "resumable": "checkpoints in target/ckpt",
                                         "multi-host": "shards go to peer1 with --peer"}
    assert from_headers(["nonsense", "resumable:", "shards: typo"]) == {}
    assert missing(from_headers(DECLARATION)) == []
    assert missing(["resumable"]) == ["sharded", "multi-host"]
    assert missing([]) == list(KEYS)


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "-"), (0.25, "0.2 s"), (9.96, "10.0 s"), (10, "10 s"), (59.4, "59 s"), (60, "1 min"),
    (3599, "60 min"), (3600, "1.0 h"), (7560, "2.1 h"),
])
def test_format_duration(seconds: float | None, shown: str) -> None:
    assert format_duration(seconds) == shown


def test_check_name_messages() -> None:
    assert check_name(None, "--label") is None
    with pytest.raises(UsageError, match=r"^--group: must not be empty$"):
        check_name("  ", "--group")
    with pytest.raises(UsageError) as caught:
        check_name("a\x1b[2Jb", "--label")
    assert str(caught.value) == ("--label a\\x1b[2Jb: control character \\x1b not allowed "
                                 "(names are printed in other sessions' output)")


def test_storable_escapes_only_undecodable_bytes() -> None:
    assert storable("naïve\nline") == "naïve\nline"
    assert storable(b"ok\xff\xfe".decode("utf-8", "surrogateescape")) == "ok\\xff\\xfe"


# ------------------------------------------------------------------------- the one peer-cap rule
def test_a_default_cap_above_peer_memory_cap_is_bounded_not_refused() -> None:
    """Without ``-m``, a ``default_cap`` above the peer's ``peer_memory_cap`` gives way to it, the
    same in the dispatcher, in ``--peer``'s check and on the agent (which always did so); only an
    explicit ``-m`` above it is refused (249, or never fits)."""
    s = settings(peer_memory_cap=2 * GiB)
    s.hosts[PEER] = s.hosts[PEER]._replace(default_cap=4 * GiB)
    judged = judge(host_for(s, PEER), Job("job"), reading(PEER, 8 * GiB, default_cap=4 * GiB))
    assert (judged.fits, judged.need) == (True, 2 * GiB)
    assert choose_peer(s, PEER, None).name == PEER
    assert effective_cap(host_for(s, PEER), None) == 2 * GiB
    assert host_for(s, PEER).pending_estimate(None) == 2 * GiB
    with pytest.raises(OverPeerCapError):
        choose_peer(s, PEER, 3 * GiB)


# The parsers were regular expressions; they are now written by hand (no ``re`` on the path of
# ``hostrun -m 8G``). They must accept and refuse exactly what the expressions did.
_OLD_SIZE = r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(?:i?b)?\s*$"
_OLD_DUR = r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)?\s*$"
_OLD_SIZE_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40, "p": 1 << 50}
_OLD_DUR_MULT = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _old(kind: str, text: str) -> float | None:
    import re

    m = re.match(_OLD_SIZE if kind == "size" else _OLD_DUR, text, re.IGNORECASE)
    if not m:
        return None
    if kind == "size":
        return int(float(m.group(1)) * _OLD_SIZE_MULT[m.group(2).lower()])
    return float(m.group(1)) * _OLD_DUR_MULT[(m.group(2) or "").lower()]


def _new(kind: str, text: str) -> float | None:
    try:
        return parse_size(text) if kind == "size" else parse_duration(text)
    except ValueError:
        return None


def _samples() -> list[str]:
    import random

    rng = random.Random(13)
    alphabet = list("0123456789.. \tkKmMgGtTpPiIbBsShHdDn-x\u0663\u00a0")
    fixed = ["8G", "1.5GiB", " 512 mb ", "1024", "5b", "5ib", "5.", ".5", "5..0", "1.5.2", "5 k b",
             "2h", "250ms", "1.5m", "10min", "3 d", "4MS", "\u0663G", "1\u00a0G", "", " ", "G", "-1G",
             "1e3", "+5", "5 ", "5\n", "0", "00.10k"]
    return fixed + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 7))) for _ in range(4000)]


@pytest.mark.parametrize("kind", ["size", "duration"])
def test_hand_written_parsers_agree_with_the_expressions_they_replaced(kind: str) -> None:
    differ = [(text, _old(kind, text), _new(kind, text)) for text in _samples()
              if _old(kind, text) != _new(kind, text)]
    assert differ == []
