"""A stand-in for systemd's notification socket (tests/systemd/test-systemd.sh): binds a datagram
socket at PATH, prints "bound", then one line per notification received, "NOTIFY <text>" (newlines
as spaces). On READY=1 it runs CHECK at once (a client that must find the broker serving) and
prints "check-exit=N". Ends after STOPPING=1, or after 30 s of silence.
    notify_listener.py PATH [CHECK ...]
"""
import socket
import subprocess
import sys

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
