"""The image, built with podman, pushed to the loopback upstream (token auth) and
pulled back through the authenticated pull-through mirror, as a cluster would.

The first half of running mirrorgate in the cluster from its own image; the
in-cluster half needs the real node (tests/e2e/harness/node.py)."""

from __future__ import annotations

import json

import pytest

from tests.e2e.harness.dockerconfig import Credentials
from tests.e2e.harness.registry import RegistryStack
from tests.e2e.harness.registry_client import RegistryClient
from tests.image.podman import RUN_AS, build, push

pytestmark = [pytest.mark.e2e, pytest.mark.image]

REPOSITORY = "mirrorgate/mirrorgate"


@pytest.fixture(scope="module")
def image() -> str:
    """The image `make image` builds (cached by podman: seconds when unchanged)."""
    return build("build.sh", env={"TAG": "localhost/mirrorgate:under-test"})


def test_pushed_image_is_pulled_through_the_mirror(image: str, registry: RegistryStack) -> None:
    pushed = push(
        image,
        f"{registry.upstream_host}/{REPOSITORY}:under-test",
        ca_path=registry.ca_path,
        username=registry.upstream_username,
        password=registry.upstream_password,
    )
    with RegistryClient(
        registry.host,
        ca_file=str(registry.ca_path),
        credentials=Credentials(registry.username, registry.password),
    ) as mirror:
        assert mirror.pull(REPOSITORY, "under-test") == pushed
        _, manifest = mirror.manifest(REPOSITORY, pushed)
        config = json.loads(mirror.blob(REPOSITORY, manifest["config"]["digest"]))
    assert config["config"]["User"] == RUN_AS
    assert config["config"]["Entrypoint"] == ["mirrorgate"]
