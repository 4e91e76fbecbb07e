"""/api/v1's request and answer types, one module by resource: one definition for llmgwd,
which decodes requests into them and answers them, and the llmgw command, which sends them and
decodes the answers; every name is importable from here (`from llmgw.api_types import X`)."""

from llmgw.api_types.common import (
    NAME_PATTERN,
    NAME_RULE,
    Email,
    ErrorAnswer,
    ErrorBody,
    ExternalId,
    Name,
    Title,
)
from llmgw.api_types.keys import (
    KeyView,
    NewKey,
)
from llmgw.api_types.limits import (
    KeyLimits,
    LevelView,
    Period,
)
from llmgw.api_types.login import (
    DeviceAuthorization,
    DevicePending,
    DevicePoll,
    DeviceStart,
    LoginAnswer,
    OidcInfo,
    OidcLogin,
)
from llmgw.api_types.mirror import (
    UploadView,
)
from llmgw.api_types.models import (
    CacheType,
    Engine,
    Kind,
    ModelRemoved,
    ModelView,
    PlaceView,
    PlanView,
    Profile,
    ProfilePlan,
    ReplicaView,
    Verdict,
)
from llmgw.api_types.nodes import (
    NodeFlagsView,
    NodeRemoved,
    NodeView,
)
from llmgw.api_types.people import (
    Deleted,
    MemberRemoved,
    MembershipView,
    OrgView,
    PersonKeyView,
    PersonRole,
    ProjectView,
    ScopeView,
    StaffRoleName,
    StaffView,
    TeamView,
    UserDeleted,
    UserView,
)
from llmgw.api_types.servers import (
    Health,
    ServerRemoved,
    ServerView,
)
from llmgw.api_types.slurm import (
    SlurmNodeView,
    SlurmView,
)
from llmgw.api_types.status import (
    ModelCounts,
    NodeCounts,
    ReplicaCounts,
    StatusView,
)
from llmgw.api_types.tokens import (
    MetricsTokenView,
    ScimTokenView,
    TokenView,
)
from llmgw.api_types.usage import (
    UsageReport,
    UsageRow,
)

__all__ = [
    "NAME_PATTERN",
    "NAME_RULE",
    "CacheType",
    "Deleted",
    "DeviceAuthorization",
    "DevicePending",
    "DevicePoll",
    "DeviceStart",
    "Email",
    "Engine",
    "ErrorAnswer",
    "ErrorBody",
    "ExternalId",
    "Health",
    "KeyLimits",
    "KeyView",
    "Kind",
    "LevelView",
    "LoginAnswer",
    "MemberRemoved",
    "MembershipView",
    "MetricsTokenView",
    "ModelCounts",
    "ModelRemoved",
    "ModelView",
    "Name",
    "NewKey",
    "NodeCounts",
    "NodeFlagsView",
    "NodeRemoved",
    "NodeView",
    "OidcInfo",
    "OidcLogin",
    "OrgView",
    "Period",
    "PersonKeyView",
    "PersonRole",
    "PlaceView",
    "PlanView",
    "Profile",
    "ProfilePlan",
    "ProjectView",
    "ReplicaCounts",
    "ReplicaView",
    "ScimTokenView",
    "ScopeView",
    "ServerRemoved",
    "ServerView",
    "SlurmNodeView",
    "SlurmView",
    "StaffRoleName",
    "StaffView",
    "StatusView",
    "TeamView",
    "Title",
    "TokenView",
    "UploadView",
    "UsageReport",
    "UsageRow",
    "UserDeleted",
    "UserView",
    "Verdict",
]
