"""mirrorgate's pure core: image references, the mirror policy, rewrite planning.

Values in, values out: nothing here reads files, the environment, the clock
or the network (an import-linter contract in pyproject.toml checks it).
"""

from mirrorgate.policy.composition import Composition, compose, from_policy, judge
from mirrorgate.policy.decision import (
    IMAGE_OUTCOMES,
    MODE_LABEL,
    ImageDecision,
    ImageOutcome,
    PodExemption,
    decide_image,
    exempt_pod,
)
from mirrorgate.policy.failover import Choice, PassedOver, choose_mirror, health_warning
from mirrorgate.policy.health import HEALTHY, NOT_PROBED, UNPROBED, Health, HealthSettings
from mirrorgate.policy.loader import load
from mirrorgate.policy.matching import Resolution, ResolutionOutcome
from mirrorgate.policy.model import (
    AUDIT,
    DELIVERIES,
    ENFORCE,
    MODES,
    CredentialGrant,
    Delivery,
    FieldError,
    Mode,
    OnCredentialError,
    Policy,
    PolicyError,
)
from mirrorgate.policy.objects import (
    API_VERSION,
    CLUSTER_KIND,
    DEFAULT_OBJECT_NAMESPACE,
    NAMESPACED_KIND,
    ObjectKey,
    PolicyObject,
    is_policy_object,
    parse_object,
)
from mirrorgate.policy.planner import (
    CONTAINER_FIELDS,
    MIRROR_POD_ANNOTATION,
    ORIGINAL_IMAGES_ANNOTATION,
    PULL_SECRET_PREFIX,
    SITE_FIELDS,
    SKIP_LABEL,
    ContainerField,
    ImageRewrite,
    ImageSite,
    RewritePlan,
    ShapeKey,
    SiteField,
    audit_mode_line,
    find_image_sites,
    plan,
    pull_secret_name,
    shape_key,
)
from mirrorgate.policy.plans import UNMIRRORED_REASONS, UnmirroredReason
from mirrorgate.policy.podview import planning_view
from mirrorgate.policy.quoting import prefix, quote
from mirrorgate.policy.reference import (
    REFERENCE_LENGTH_MAX,
    ImageReference,
    InvalidReferenceError,
    parse,
    parse_normalized,
)
from mirrorgate.policy.rules import Mirror, MirrorRule, Source
from mirrorgate.policy.sites import CONTAINER_NAME_LENGTH_MAX, NEVER, container_count
from mirrorgate.policy.verdicts import Verdict

__all__ = [
    "API_VERSION",
    "AUDIT",
    "CLUSTER_KIND",
    "CONTAINER_FIELDS",
    "CONTAINER_NAME_LENGTH_MAX",
    "DEFAULT_OBJECT_NAMESPACE",
    "DELIVERIES",
    "ENFORCE",
    "HEALTHY",
    "IMAGE_OUTCOMES",
    "MIRROR_POD_ANNOTATION",
    "MODES",
    "MODE_LABEL",
    "NAMESPACED_KIND",
    "NEVER",
    "NOT_PROBED",
    "ORIGINAL_IMAGES_ANNOTATION",
    "PULL_SECRET_PREFIX",
    "REFERENCE_LENGTH_MAX",
    "SITE_FIELDS",
    "SKIP_LABEL",
    "UNMIRRORED_REASONS",
    "UNPROBED",
    "Choice",
    "Composition",
    "ContainerField",
    "CredentialGrant",
    "Delivery",
    "FieldError",
    "Health",
    "HealthSettings",
    "ImageDecision",
    "ImageOutcome",
    "ImageReference",
    "ImageRewrite",
    "ImageSite",
    "InvalidReferenceError",
    "Mirror",
    "MirrorRule",
    "Mode",
    "ObjectKey",
    "OnCredentialError",
    "PassedOver",
    "PodExemption",
    "Policy",
    "PolicyError",
    "PolicyObject",
    "Resolution",
    "ResolutionOutcome",
    "RewritePlan",
    "ShapeKey",
    "SiteField",
    "Source",
    "UnmirroredReason",
    "Verdict",
    "audit_mode_line",
    "choose_mirror",
    "compose",
    "container_count",
    "decide_image",
    "exempt_pod",
    "find_image_sites",
    "from_policy",
    "health_warning",
    "is_policy_object",
    "judge",
    "load",
    "parse",
    "parse_normalized",
    "parse_object",
    "plan",
    "planning_view",
    "prefix",
    "pull_secret_name",
    "quote",
    "shape_key",
]
