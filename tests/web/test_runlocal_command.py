"""`make run`'s own pieces that need no whole stack: the environment its processes get and what
it prints of its web server's stop."""

import os
import signal
import socket
import time

import httpx
import psutil

from moeops.front.management.commands import runlocal


def test_its_processes_get_the_site_url_of_the_port_it_serves():
    env = runlocal.site_env({"PATH": "/usr/bin"}, 8101)

    assert env["SITE_ROOT"] == "http://127.0.0.1:8101"
    assert env["PATH"] == "/usr/bin"


def test_a_site_url_the_environment_names_is_kept():
    env = runlocal.site_env({"SITE_ROOT": "https://moeops.example.org"}, 8101)

    assert env["SITE_ROOT"] == "https://moeops.example.org"


def test_a_web_worker_killed_at_the_stop_is_not_said_to_be_out_of_memory(free_port, capsys):
    port = free_port()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    web = runlocal.Child("web", runlocal.web_argv(port), runlocal.site_env(os.environ, port))
    web.start()
    try:
        deadline = time.monotonic() + 30
        # its workers answer (the port is bound by gunicorn's master before they boot)
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/api/v1/", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "gunicorn did not start"
                time.sleep(0.2)
        # a browser's request whose headers have not all come: its worker cannot stop in time
        half = socket.create_connection(("127.0.0.1", port))
        half.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        time.sleep(0.5)
        # Ctrl-C reaches the whole process group, make run's children too
        web.proc.send_signal(signal.SIGINT)
        runlocal._stop_all([web], before)
        web._reader.join(5)
        half.close()
    finally:
        if web.proc.poll() is None:
            web.proc.kill()

    said = "\n".join(web.tail)
    printed = capsys.readouterr().out
    assert "was still in a request 5 s after make run began to stop" in said, said
    assert "Perhaps out of memory" not in said and "Perhaps out of memory" not in printed
