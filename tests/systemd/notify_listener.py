"""A stand-in for systemd's notification socket (tests/systemd/test-systemd.sh): binds a datagram
socket at PATH, prints "bound", then one line per notification received, "NOTIFY <text>" (newlines
as spaces). On READY=1 it runs CHECK at once (a client that must find the broker serving) and
prints "check-exit=N". Ends after STOPPING=1, or after 30 s of silence.
    notify_listener.py PATH [CHECK ...]
With --full, a receiver that never reads: binds PATH, fills its queue until a sender would block,
prints "full (N datagrams)", and sleeps until killed (at most 60 s).
    notify_listener.py --full PATH
"""
import socket
import subprocess
import sys
import time

if sys.argv[1] == '--full':
    path = sys.argv[2]
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    w = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    w.connect(path)
    w.setblocking(False)
    n = 0
    try:
        while n < 100000:
            w.send(b'X=1')
            n += 1
    except BlockingIOError:
        pass
    print('full (%d datagrams)' % n, flush=True)
    time.sleep(60)
    sys.exit(0)

path, check = sys.argv[1], sys.argv[2:]
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(30)
print('bound', flush=True)
try:
    while True:
        text = s.recv(4096).decode(errors='replace')
        print('NOTIFY ' + text.replace('\n', ' '), flush=True)
        if 'READY=1' in text.split('\n') and check:
            r = subprocess.run(check, capture_output=True, text=True)
            print('check-exit=%d %s' % (r.returncode, (r.stdout + r.stderr).replace('\n', ' ')), flush=True)
        if 'STOPPING=1' in text.split('\n'):
            break
except socket.timeout:
    print('silence', flush=True)
