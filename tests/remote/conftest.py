"""A real S3 server for the remote-cache tests: moto's server mode on 127.0.0.1 (HTTP, in a thread of this
process), never a mock of the client; every test runs with the standard AWS configuration pointing at it."""
from __future__ import annotations

import logging

import pytest

boto3 = pytest.importorskip("boto3", reason="the [s3] extra is not installed: pip install 'neuron-args[s3]'")
moto_server = pytest.importorskip("moto.server", reason="moto[server] is not installed (scripts/setup.sh installs it)")

from neuron_args.activity import ACTIVITY  # noqa: E402
from neuron_args.cache import ASSERT_CACHE_HIT_ENV  # noqa: E402
from neuron_args.remote_cache import TIMEOUT_ENV  # noqa: E402
from tests.remote.s3_helpers import BUCKET, free_port  # noqa: E402


@pytest.fixture(scope="session")
def s3_endpoint():
    """A moto S3 server on a free loopback port for the session, with the bucket the tests share."""
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    port = free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    url = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=BUCKET)
    yield url
    server.stop()


@pytest.fixture(autouse=True)
def _aws(monkeypatch, tmp_path, s3_endpoint):
    """The standard AWS configuration only: the endpoint, static test credentials, no profile files."""
    for name, value in {"AWS_ENDPOINT_URL": s3_endpoint, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                        TIMEOUT_ENV: "5"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", ASSERT_CACHE_HIT_ENV, "NEURON_ARGS_CACHE_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    ACTIVITY.reset()


@pytest.fixture
def client(s3_endpoint):
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")
