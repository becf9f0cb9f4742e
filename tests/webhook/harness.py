"""The app in process behind Starlette's TestClient, on a policy file and a recording fake."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson

from mirrorgate.webhook import policyfile
from mirrorgate.webhook.edge import app
from tests.webhook import policies
from tests.webhook.fakes import RecordingPullSecrets
from tests.webhook.testclient import TestClient


@dataclasses.dataclass
class Harness:
    """The app in process (Starlette TestClient) with the runtime and fake it was built on."""

    client: TestClient
    runtime: app.Runtime
    secrets: RecordingPullSecrets

    def post(self, path: str, body: Any, **kwargs: Any) -> Any:
        """POST ``body`` as JSON to ``path``; the decoded JSON answer (status must be 200)."""
        response = self.client.post(
            path, content=orjson.dumps(body), headers={"content-type": "application/json"}, **kwargs
        )
        assert response.status_code == 200, response.text
        return response.json()

    def mutate(self, body: Any) -> dict[str, Any]:
        """The ``response`` of /mutate for ``body``."""
        answer = self.post("/mutate", body)
        assert answer["apiVersion"] == body["apiVersion"]
        response = answer["response"]
        assert isinstance(response, dict)
        return response


def make_harness(
    tmp_path: Path,
    policy_text: str = policies.POLICY,
    secrets: RecordingPullSecrets | None = None,
    *,
    audit_only: bool = False,
) -> Harness:
    """An app on ``policy_text`` (written to a file and read as the server reads it)."""
    path = tmp_path / "policy.yaml"
    path.write_text(policy_text)
    secrets = secrets or RecordingPullSecrets()
    runtime = app.Runtime(
        policy=policyfile.read_policy(path), secrets=secrets, audit_only=audit_only
    )
    client = TestClient(
        app.create_app(runtime), base_url="https://testserver", raise_server_exceptions=False
    )
    return Harness(client=client, runtime=runtime, secrets=secrets)
