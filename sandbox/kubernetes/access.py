"""`kubectl auth can-i`: the SelfSubjectAccessReview of `authorization.k8s.io/v1`.

The emulator knows one bearer token, the cluster admin's (no RBAC, no token scopes: a wrong
token is refused with a 401 before any review), so every well-formed review of the token
that asks is allowed, as kube-apiserver answers a `system:masters` member. A review is not
stored: the answer is the request with its `status` filled in (201, as kube-apiserver).
"""

from __future__ import annotations

import copy

from autoclusters.sandbox.kubernetes.objects import Kind, Obj, bad_request, invalid

GROUP_VERSION = "authorization.k8s.io/v1"
RESOURCE = "selfsubjectaccessreviews"
PATH = f"/apis/{GROUP_VERSION}/{RESOURCE}"
KIND = Kind(RESOURCE, "SelfSubjectAccessReview", GROUP_VERSION, namespaced=False)
# The discovery entry (create only: a review is asked, never read back).
DISCOVERY: Obj = {
    "name": RESOURCE,
    "singularName": "selfsubjectaccessreview",
    "namespaced": False,
    "kind": KIND.kind,
    "verbs": ["create"],
}
REASON = "the emulator's token is its cluster admin's (no RBAC here)"


def review(body: object) -> Obj:
    """The review with its answer; a 400/422 naming the field for a malformed one."""
    if not isinstance(body, dict):
        raise bad_request("the body of a SelfSubjectAccessReview must be a JSON object")
    if body.get("kind") not in (None, KIND.kind):
        raise bad_request(f"a {body.get('kind')} is not a SelfSubjectAccessReview")
    spec = body.get("spec")
    if not isinstance(spec, dict):
        raise invalid(KIND, "", "spec", "Required value")
    asked = [k for k in ("resourceAttributes", "nonResourceAttributes") if spec.get(k)]
    if len(asked) != 1:
        raise invalid(
            KIND,
            "",
            "spec.resourceAttributes",
            "Invalid value: exactly one of nonResourceAttributes or resourceAttributes must "
            "be specified",
        )
    attributes = spec[asked[0]]
    if not isinstance(attributes, dict) or not attributes.get("verb"):
        raise invalid(KIND, "", f"spec.{asked[0]}.verb", "Required value")
    out = copy.deepcopy(body)
    out.update(apiVersion=GROUP_VERSION, kind=KIND.kind)
    out.setdefault("metadata", {})
    out["status"] = {"allowed": True, "reason": REASON}
    return out
