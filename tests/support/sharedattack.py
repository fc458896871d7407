"""The attacker's script against the shared slice's engine (malformed, oversized, deeply nested and
out-of-range requests, connection and pipelined floods), run as a member in the VM
(tests/vm/test_vm_shared_hostile.py) and locally (tests/system/test_shared_daemon.py)."""

from __future__ import annotations

import textwrap

ATTACK = textwrap.dedent("""\
    import json, os, random, socket, sys, time
    PATH = os.environ.get("ATTACK_SOCKET", "/run/hostrun/shared.sock")
    kind, seed = sys.argv[1], int(sys.argv[2])
    rnd = random.Random(seed)

    def conn():
        "A connection; a full backlog (EAGAIN: the server busy with others' floods) is tried again."
        for attempt in range(200):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(120)
            try:
                s.connect(PATH)
                return s
            except BlockingIOError:
                s.close()
                time.sleep(0.05)
        raise SystemExit("the server's backlog stayed full for 10 s")

    def say(s, data):
        "Send, then read every answer to the end (the daemon may close first: fine)."
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        got = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        except OSError:
            pass
        s.close()
        return got

    def line(obj):
        return json.dumps(obj).encode() + b"\\n"

    def weird():
        return rnd.choice([2 ** 63, -2 ** 63, 2 ** 64 + 1, 10 ** 400, -1, 0, 1, 1.5, 1e308, -1e308,
                           float("nan"), float("inf"), True, None, "1", "x" * 300, [], [1] * 50,
                           {"a": 1}, 1 << 23, 4194304, 4194305])

    def request():
        "One out-of-range or odd request (valid JSON; the connection stays)."
        op = rnd.choice(["scope", "plan", "attach", "release", "record", "park", "cgroup", "hello",
                         "list", "unbook", weird()])
        m = {"op": op}
        for key in rnd.sample(["pids", "cap", "id", "unit", "label", "protocol", "status_interval",
                               "call", "peak", "run"], 3):
            m[key] = weird()
        if op == "plan" and rnd.random() < 0.5:  # a run's fields, one of them odd
            run = {"host": "local", "label": "fuzz", "pid": os.getpid(), "pid_start": 0,
                   "cap": 1 << 20, "no_cap": False, "program": "x", "command": "x", "session": None,
                   "group": None, "when_idle": False, "booking_id": None, "requeue": False,
                   "gamble": 1 << 20, "gpu": None}
            run[rnd.choice(sorted(run))] = weird()
            m["run"] = run
        if op == "scope" and rnd.random() < 0.5:
            m["pids"] = [weird(), weird()][: rnd.randint(1, 2)]
        return line(m)

    def malformed():
        "A line that ends its connection: not JSON, not an object, nested too deep, too long."
        return rnd.choice([
            lambda: bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 200))) + b"\\n",
            lambda: b"[" * rnd.choice([1001, 5000, 20000, 100000]) + b"\\n",
            lambda: b'{"a":' * rnd.choice([1001, 8000, 30000]) + b"\\n",
            lambda: b"[1]\\n", lambda: b'"op"\\n', lambda: b'{"op": "book", "size": \\n',
            lambda: b'{"op": "list", "pad": "' + b"x" * rnd.choice([70000, 300000]) + b'"}\\n',
            lambda: b"x" * 2_000_000,
            lambda: b'{"op": "book", "size": ' + b"9" * 5000 + b"}\\n",
        ])()

    sent = 0
    if kind == "crash":  # the issue's three reproductions, then a check that the daemon answers
        print("nested", say(conn(), b"[" * 100000 + b"\\n")[:80], flush=True)
        child = os.fork()
        if child == 0:
            time.sleep(60)
            os._exit(0)
        unit = "hostrun-shared-%d-%d-1.scope" % (os.getuid(), child)
        answers = say(conn(), line({"op": "scope", "pids": [2 ** 63], "cap": 1 << 20, "unit": unit})
                      + line({"op": "scope", "pids": [child], "cap": 1 << 20, "unit": unit,
                              "grace": 10 ** 400}))
        print("numbers", answers.decode(errors="replace").strip().replace("\\n", " | "), flush=True)
        os.kill(child, 9)
        held, refused = [], 0
        for _ in range(1100):
            try:
                held.append(conn())
            except OSError:
                refused += 1
        # the backlog is first come, first accepted: the last is refused while the first 128 stay
        last = held[-1].recv(4096).decode(errors="replace").strip()
        for s in held:
            s.close()
        print("connections", len(held), refused, last, flush=True)
    elif kind == "flood":  # pipelined requests never read; the connection held until told
        s = conn()
        s.setblocking(False)
        data = b'{"op":"list"}\\n' * int(sys.argv[3])
        try:
            while data:
                data = data[s.send(data):]
        except BlockingIOError:
            pass
        except OSError as exc:
            print("flood dropped while sending", exc, flush=True)
        print("flooding", flush=True)
        while not os.path.exists("stop"):
            time.sleep(0.2)
    else:  # fuzz: requests, malformed lines and pipelined floods until `count` are sent
        count = int(sys.argv[3])
        floods = []
        broken = flooded = 0
        while sent < count:
            roll = rnd.random()
            if roll < 0.50:  # a batch of odd requests on one connection, every answer read
                n = rnd.randint(5, 50)
                say(conn(), b"".join(request() for _ in range(n)))
                sent += n
            elif roll < 0.97:
                say(conn(), malformed())
                sent += 1
                broken += 1
            else:  # a pipelined flood nobody reads, left open (not counted in `sent`)
                s = conn()
                s.setblocking(False)
                n = rnd.choice([4000, 20000])
                try:
                    s.send(b'{"op":"list"}\\n' * n)
                except OSError:
                    pass
                floods.append(s)
                flooded += n
                if len(floods) > 20:
                    floods.pop(0).close()
        for s in floods:
            s.close()
        print("malformed", broken, "flooded", flooded, flush=True)
    print("sent", sent, flush=True)
""")
