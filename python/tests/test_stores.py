"""`prep.open` on a dataset in an S3 store (moto's server on 127.0.0.1, `scripts/test-servers.sh
install`): the same samples, batches and errors as from the local copy, and no secret in them."""

import os
import shutil
import socket
import subprocess
import time
import urllib.request

import numpy as np
import pytest

import prep
from conftest import prep_bin, synth

SECRET = "pyS3cretValue987654321"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server with bucket `prep-test`, and the environment prep needs for it."""
    exe = shutil.which("moto_server")
    if exe is None:
        if os.environ.get("PREP_REQUIRE_SERVERS") == "1":
            pytest.fail("PREP_REQUIRE_SERVERS=1 but moto_server is not installed")
        pytest.skip("moto_server is not installed (scripts/test-servers.sh install)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "w")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while True:
        try:
            urllib.request.urlopen(urllib.request.Request(f"{endpoint}/prep-test", method="PUT"), timeout=2)
            break
        except Exception:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("moto_server did not answer within 30 s")
            time.sleep(0.1)
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "PREP_STORE_RETRY_SECONDS": "3",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    proc.kill()
    proc.wait()


def test_a_dataset_in_s3_reads_as_its_local_copy(s3, tmp_path):
    local = synth(tmp_path / "ds", 900, test=120)
    url = "s3://prep-test/py/ds"
    r = subprocess.run([prep_bin(), "synth", "--train", "900", "--test", "120", "--shape", "3x8x8",
                        "--block-samples", "64", "--shard-blocks", "5", "--seed", "0", "--out", url,
                        "--quiet"], capture_output=True, text=True, env={**os.environ, **s3})
    assert r.returncode == 0, r.stderr
    a, b = prep.open(local), prep.open(url)
    assert b.path == url
    # The same dataset; only the command line in the provenance (and so the seal) differs.
    ma, mb = dict(a.manifest), dict(b.manifest)
    for m in (ma, mb):
        m.pop("checksum")
        m["provenance"].pop("command")
    assert ma == mb
    for split in ("train", "test"):
        x, y = a[split], b[split]
        assert len(x) == len(y)
        for i in (0, 1, len(x) // 2, len(x) - 1):
            xa, ya = x[i]
            xb, yb = y[i]
            assert np.array_equal(xa, xb) and ya == yb
    before = prep.store_traffic()
    got = [(xb.copy(), yb.copy()) for xb, yb in b["train"].batches(100, seed=5, epoch=1)]
    after = prep.store_traffic()
    want = [(xa.copy(), ya.copy()) for xa, ya in a["train"].batches(100, seed=5, epoch=1)]
    # An epoch reads each of the split's blocks once (900 samples in blocks of 64: 15), and
    # brings at most the shards' bytes; reading the local copy adds nothing.
    assert after["requests"] - before["requests"] == 15
    shard_bytes = sum(s["bytes"] for s in b.manifest["splits"]["train"]["shards"])
    assert 0 < after["bytes"] - before["bytes"] < shard_bytes
    assert prep.store_traffic() == after
    assert len(got) == len(want)
    for (xa, ya), (xb, yb) in zip(want, got):
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)


def test_a_missing_dataset_or_a_signed_url_raises_without_showing_a_secret(s3):
    with pytest.raises(Exception) as e:
        prep.open("s3://prep-test/nothing/here")
    assert "no dataset there" in str(e.value)
    with pytest.raises(ValueError) as e:
        prep.open(f"s3://prep-test/py/ds?X-Amz-Signature={SECRET}")
    assert SECRET not in str(e.value)
    with pytest.raises(ValueError) as e:
        prep.open("ftp://host/ds")
    assert "not a store prep knows" in str(e.value)
