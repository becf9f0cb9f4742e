"""Realistic Pods and AdmissionReview request bodies for the benchmarks.

Production Pods carry far more than names and images: env vars, mounts,
probes, resources, labels and owner references. That bulk is what JSON
decoding and TLS pay for per admission, so the bodies here are padded with
such fields up to a target size instead of being minimal Pods.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import orjson

__all__ = ["admission_review", "pod", "review_body"]

DIGEST = "sha256:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"


def _container(name: str, image: str, env_count: int) -> dict[str, Any]:
    return {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "ports": [
            {"name": "http", "containerPort": 8080, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9090, "protocol": "TCP"},
        ],
        "env": [
            {
                "name": f"APP_SETTING_{i:03d}",
                "value": f"value-{i:03d}-{name}-with-some-realistic-length",
            }
            for i in range(env_count)
        ]
        + [
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
            {
                "name": "DB_PASSWORD",
                "valueFrom": {"secretKeyRef": {"name": "db-credentials", "key": "password"}},
            },
        ],
        "resources": {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {"cpu": "1", "memory": "512Mi"},
        },
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/app", "readOnly": True},
            {"name": "data", "mountPath": "/var/lib/app"},
            {
                "name": "kube-api-access-x7k2p",
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                "readOnly": True,
            },
        ],
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/readyz", "port": 8080, "scheme": "HTTP"},
            "periodSeconds": 5,
            "timeoutSeconds": 1,
            "successThreshold": 1,
            "failureThreshold": 3,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
    }


def pod(
    images: Sequence[str],
    *,
    name: str = "billing-api-7d9c5b7f4-x2x9q",
    namespace: str = "team-a",
    env_count: int = 4,
) -> dict[str, Any]:
    """A Deployment-made Pod whose containers run ``images`` in order."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": name.rsplit("-", 1)[0] + "-",
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "billing-api",
                "app.kubernetes.io/instance": "billing-api-prod",
                "app.kubernetes.io/version": "1.4.2",
                "app.kubernetes.io/part-of": "billing",
                "pod-template-hash": "7d9c5b7f4",
            },
            "annotations": {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090",
                "kubectl.kubernetes.io/default-container": "main",
            },
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "billing-api-7d9c5b7f4",
                    "uid": "5f0c9c58-6b8e-4f67-9d7c-2f1d4b0e8a11",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                _container("main" if i == 0 else f"sidecar-{i}", image, env_count)
                for i, image in enumerate(images)
            ],
            "volumes": [
                {"name": "config", "configMap": {"name": "billing-api-config", "defaultMode": 420}},
                {"name": "data", "emptyDir": {}},
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {
                        "defaultMode": 420,
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {
                                "configMap": {
                                    "name": "kube-root-ca.crt",
                                    "items": [{"key": "ca.crt", "path": "ca.crt"}],
                                }
                            },
                        ],
                    },
                },
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "billing-api",
            "securityContext": {"fsGroup": 2000},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }


def admission_review(
    pod_object: dict[str, Any], *, uid: str, kind: str = "Pod", resource: str = "pods"
) -> dict[str, Any]:
    """A CREATE review for ``pod_object`` (or another core ``kind``) as the API server sends it."""
    gvk = {"group": "", "version": "v1", "kind": kind}
    gvr = {"group": "", "version": "v1", "resource": resource}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": gvk,
            "resource": gvr,
            "requestKind": gvk,
            "requestResource": gvr,
            "namespace": pod_object["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": "0d3c7e5e-1f0a-4c7e-9a3b-6f5e2d1c0b9a",
                "groups": [
                    "system:serviceaccounts",
                    "system:serviceaccounts:kube-system",
                    "system:authenticated",
                ],
            },
            "object": pod_object,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def review_body(images: Sequence[str], *, uid: str, target_bytes: int = 0) -> bytes:
    """The JSON body of a review of a Pod running ``images``, padded to >= ``target_bytes``.

    Padding grows every container's env list evenly (what a chart with many
    settings produces), so size scales with the container count as in life.
    """
    for env_count in itertools.count(0):
        body = orjson.dumps(admission_review(pod(images, env_count=env_count), uid=uid))
        if len(body) >= target_bytes:
            return body
    raise AssertionError("unreachable")
