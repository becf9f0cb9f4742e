"""The chart's reservedPrefix.extraWriters: more usernames that may create mirrorgate-*
Secrets, set as a value instead of by patching the ValidatingAdmissionPolicy (which the next
helm upgrade's server-side apply would then conflict with).

Rendered with the pinned helm; the names' quoting is checked by reading the CEL list back,
and by a real API server, which compiles the policy and enforces it for those users.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.e2e.harness import helm as h
from tests.e2e.harness import mirrorgate as mg
from tests.e2e.harness.binaries import REPO_ROOT
from tests.e2e.harness.controlplane import ControlPlane

pytestmark = pytest.mark.e2e

OWN = "'system:serviceaccount:mirrorgate:mirrorgate'"
# A second installation's ServiceAccount, and a name that needs every kind of quoting:
# CEL's and YAML's quotes, a backslash, what Go's JSON escapes for HTML, and not ASCII.
SECOND = "system:serviceaccount:team-x:mirrorgate"
AWKWARD = "o'brien \"q\" \\x <&> ',  'injected"
UNICODE = "émile@corp.example"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("helm-home")


def _values(tmp_path: Path, writers: list[str]) -> Path:
    path = tmp_path / "writers.yaml"
    path.write_text(yaml.safe_dump({"reservedPrefix": {"extraWriters": writers}}))
    return path


def _reserved(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy"
        and o["metadata"]["name"].endswith("-reserved-prefix")
    ]
    return found


def _writers(policy: dict[str, Any]) -> str:
    (expression,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "writers"]
    return str(expression)


def _cel_list(expression: str) -> list[str]:
    """The rendered writers back as strings: the own username in single quotes, then each
    extra as a double-quoted literal whose escapes are JSON's (a subset of CEL's)."""
    assert expression.startswith(f"[{OWN}"), expression
    assert expression.endswith("]"), expression
    rest = expression[len(OWN) + 1 : -1]
    return [OWN.strip("'"), *json.loads(f"[{rest.removeprefix(', ')}]")]


def test_by_default_only_mirrorgate_writes_as_the_base_says(helm: Path, home: Path) -> None:
    """No extra writers: the expression is the base's, byte for byte."""
    base = [
        d
        for d in yaml.safe_load_all((REPO_ROOT / "manifests/base/admissionpolicy.yaml").read_text())
        if d
    ]
    assert _writers(_reserved(h.template(helm, home))) == _writers(_reserved(base)) == f"[{OWN}]"


def test_extra_writers_join_the_list_each_quoted(helm: Path, home: Path, tmp_path: Path) -> None:
    """Every name reaches the CEL list as itself: a quote in one ends no literal."""
    writers = _writers(
        _reserved(h.template(helm, home, files=[_values(tmp_path, [SECOND, AWKWARD, UNICODE])]))
    )
    assert _cel_list(writers) == [OWN.strip("'"), SECOND, AWKWARD, UNICODE]
    assert f'"{SECOND}"' in writers


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("", id="empty"),
        pytest.param(" system:serviceaccount:team-x:mirrorgate", id="leading-blank"),
        pytest.param("system:serviceaccount:team-x:mirrorgate\n", id="trailing-newline"),
        pytest.param("a\x00b", id="control-character"),
    ],
)
def test_a_name_that_is_no_username_is_refused(
    helm: Path, home: Path, tmp_path: Path, name: str
) -> None:
    done = h.run(
        helm,
        "template",
        "mirrorgate",
        str(h.CHART),
        "-f",
        str(_values(tmp_path, [name])),
        home=home,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    assert "at '/reservedPrefix/extraWriters/0'" in done.stderr, done.stderr


def test_the_api_server_lets_the_extra_writers_and_no_one_else(
    helm: Path, home: Path, tmp_path: Path, own_control_plane: ControlPlane
) -> None:
    """The rendered policy compiles, and the API server allows each extra name (awkward
    quoting and all) to create a mirrorgate-* Secret, and still refuses anyone else."""
    # A header carries the impersonated name: ASCII only (the UNICODE name is checked above).
    objects = h.template(helm, home, files=[_values(tmp_path, [SECOND, AWKWARD])])
    policy = _reserved(objects)
    (binding,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicyBinding"
        and o["metadata"]["name"] == policy["metadata"]["name"]
    ]
    with own_control_plane.api_client() as api:
        admission = k8s.AdmissionregistrationV1Api(api)
        admission.create_validating_admission_policy(policy)  # type: ignore[arg-type]
        admission.create_validating_admission_policy_binding(binding)  # type: ignore[arg-type]

        def as_user(user: str) -> k8s.ApiClient:
            impersonating = k8s.ApiClient(copy.copy(api.configuration))
            impersonating.set_default_header("Impersonate-User", user)  # type: ignore[no-untyped-call]
            impersonating.set_default_header("Impersonate-Group", "system:masters")  # type: ignore[no-untyped-call]
            return impersonating

        with as_user("e2e-someone-else") as other:
            mg.wait_reserved_in_force(other, "default")
            for user in (SECOND, AWKWARD):
                with as_user(user) as writer:
                    # The policy is in force (above): the writer is allowed at once.
                    assert mg.reserved_refused(writer, "default") == "allowed", user
            assert mg.reserved_refused(other, "default") is None  # still refused
