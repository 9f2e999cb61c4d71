"""The bind shim (hvdlike/base/bind_shim.c): with ``HVDLIKE_TF_BIND=PORT=IP`` a bind of
the wildcard address on PORT binds IP instead, and nothing else changes. Real sockets in
real processes with the shim preloaded; hvdlikerun preloads it into its ranks. (That
TensorFlow's servers then listen only on their TF_CONFIG address is checked by the native
strategy tests in tests/tf/test_tf_strategy.py.)"""
import json
import os
import shlex
import socket
import subprocess
import sys

import pytest

from hvdlike.base import bind_shim

# Prints, as JSON, the address each listed bind ended on (or the errno it failed with).
BIND_SCRIPT = """
import json, socket, sys
out = []
for family, host, port in json.loads(sys.argv[1]):
    s = socket.socket(getattr(socket, family), socket.SOCK_STREAM)
    if family == "AF_INET6":
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    try:
        s.bind((host, port))
        out.append(list(s.getsockname()[:2]))
    except OSError as e:
        out.append(e.errno)
    s.close()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def library():
    path = bind_shim.library()
    if path is None:
        pytest.skip("the bind shim cannot be built here (needs Linux and a C compiler)")
    return path


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def binds(binds_asked, preload=None, spec=None):
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", bind_shim.VARIABLE)}
    if preload:
        env["LD_PRELOAD"] = preload
    if spec:
        env[bind_shim.VARIABLE] = spec
    done = subprocess.run([sys.executable, "-c", BIND_SCRIPT, json.dumps(binds_asked)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [tuple(r) if isinstance(r, list) else r for r in json.loads(done.stdout)]


def test_a_wildcard_bind_on_the_named_port_binds_the_named_address_only(library):
    port, other = free_port(), free_port()
    asked = [("AF_INET", "0.0.0.0", port), ("AF_INET6", "::", port),
             ("AF_INET", "0.0.0.0", other), ("AF_INET", "127.0.0.1", port)]
    assert binds(asked, library, f"{port}=127.0.0.1") == [
        ("127.0.0.1", port), ("::ffff:127.0.0.1", port), ("0.0.0.0", other),
        ("127.0.0.1", port)]


def test_without_the_variable_or_without_the_shim_binds_are_unchanged(library):
    port = free_port()
    asked = [("AF_INET", "0.0.0.0", port), ("AF_INET6", "::", port)]
    assert binds(asked, library) == [("0.0.0.0", port), ("::", port)]
    assert binds(asked, None, f"{port}=127.0.0.1") == [("0.0.0.0", port), ("::", port)]


def test_an_ipv6_address_takes_the_ipv6_wildcard_and_refuses_the_ipv4_one(library):
    import errno
    port = free_port()
    asked = [("AF_INET6", "::", port), ("AF_INET", "0.0.0.0", port)]
    assert binds(asked, library, f"{port}=::1") == [("::1", port), errno.EADDRNOTAVAIL]


def test_the_shim_is_built_once_per_source_into_the_cache(library, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = bind_shim.library()
    assert built is not None and built.startswith(str(tmp_path / "hvdlike"))
    assert os.path.basename(built) == os.path.basename(library)
    mtime = os.stat(built).st_mtime_ns
    assert bind_shim.library() == built and os.stat(built).st_mtime_ns == mtime


def test_preload_env_puts_the_shim_in_front_once(library):
    assert bind_shim.preload_env({}) == {"LD_PRELOAD": library}
    assert bind_shim.preload_env({"LD_PRELOAD": "/x/a.so"}) == {"LD_PRELOAD": f"{library} /x/a.so"}
    assert bind_shim.preload_env({"LD_PRELOAD": f"/x/a.so:{library}"}) == {}


def test_hvdlikerun_preloads_the_shim_and_forwards_it_to_other_hosts(library):
    def words(*args):
        done = subprocess.run([sys.executable, "-m", "hvdlike.runner", *args, "--dry-run",
                               "python", "t.py"], capture_output=True, text=True, timeout=60,
                              env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})
        assert done.returncode == 0, done.stderr
        return shlex.split(done.stdout)
    assert f"LD_PRELOAD={library}" in words("-np", "2")
    remote = words("-np", "2", "-H", "a:1,b:1")
    assert f"LD_PRELOAD={library}" in remote
    assert [remote[i + 1] for i, w in enumerate(remote) if w == "-x"].count("LD_PRELOAD") == 1


def test_the_loaded_check_sees_the_preloaded_shim(library):
    code = "from hvdlike.base import bind_shim; print(bind_shim.loaded())"
    for preload, expected in ((library, "True"), (None, "False")):
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        if preload:
            env["LD_PRELOAD"] = preload
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.stdout.strip() == expected, done.stderr
