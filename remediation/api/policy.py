"""``/api/v1/policy``: the profiles and which governs a node, over JSON.

The same functions as ``remediation policy show|explain`` (:mod:`remediation.services.policy_views`),
read under the API process's own configuration.

Why: docs/policy.md#profiles-policy-per-node-group
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request

from remediation.api.auth import API_ERRORS
from remediation.api.routes import ClusterFilter, NodeName, Reader, node_scope, reading
from remediation.profiles.settings import PROFILE_NAME
from remediation.services import policy_views

router = APIRouter(prefix="/api/v1", tags=["policy"], responses=API_ERRORS)
ProfileName = Annotated[str, Path(pattern=PROFILE_NAME)]


@router.get("/policy", summary="The profiles in order, what each selects and overrides, nodes each governs")
def get_policy(request: Request, _: Reader) -> dict[str, Any]:
    st = request.app.state
    with st.sessions() as s:
        return policy_views.show(s, st.settings)


@router.get("/policy/profiles/{profile}", summary="One profile, every field of its policy and its layer")
def get_profile(request: Request, _: Reader, profile: ProfileName) -> dict[str, Any]:
    st = request.app.state
    with st.sessions() as s:
        return policy_views.show(s, st.settings, profile)


@router.get("/nodes/{node}/policy", summary="Which profile governs a node, why, and every field's layer")
def get_node_policy(request: Request, _: Reader, node: NodeName,
                    *, cluster: ClusterFilter = None) -> dict[str, Any]:
    st = request.app.state
    with reading(request, node_scope(request, node, cluster)) as s:
        return policy_views.explain_node(s, st.settings, node)
