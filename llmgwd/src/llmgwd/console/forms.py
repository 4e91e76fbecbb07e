"""The console's forms: each names one /api/v1 Route record (looked up in the route table, never
a second list), and a page draws it only where the person's principal passes that route's rule
(llmgwd.auth.allowed), as the route's guard will when the form is sent."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmgwd import auth
from llmgwd.api.route import Route


@dataclass(frozen=True, slots=True)
class Field:
    """One input of a form: where it goes (body.X, query.X) and how it is shown."""

    name: str  # "body.replicas", "query.files"
    label: str
    kind: str = "number"  # an <input> type: number, checkbox, text
    value: str = ""  # its first value ("true" for a checkbox: sent when ticked)
    step: str = "1"  # a number's: "any" for a fraction
    required: bool = False  # the browser sends the form only with it filled (or ticked)


@dataclass(frozen=True, slots=True)
class Form:
    """A form of a page: the route it sends, its button and inputs."""

    method: str
    path: str  # the Route record's, as routes.TABLE has it
    button: str
    fields: tuple[Field, ...] = ()
    danger: bool = False  # it removes something: drawn apart
    fixed: Mapping[str, str] = field(default_factory=dict)  # path parameters the form sets


@dataclass(frozen=True, slots=True)
class Drawn:
    """A form as a page draws it: its route, the path's parameters and the inputs' values."""

    form: Form
    route: Route
    params: Mapping[str, str]
    values: Mapping[str, str] = field(default_factory=dict)

    @property
    def route_field(self) -> str:
        """What the form's `route` field carries: the Route record's method and path."""
        return route_key(self.route)


def route_key(route: Route) -> str:
    """A Route record's key among the console's forms: "METHOD PATH"."""
    return f"{route.method} {route.path}"


class Routes:
    """The route table, by route_key and by method and plain path; and the routes the console's
    forms send: acts (POST /console/act's) and makes (POST /console/made's, whose answer holds
    a secret). A form naming a route that is not one fails at once (KeyError)."""

    def __init__(
        self, table: Iterable[Route], forms: Iterable[Form] = (), making: Iterable[Form] = ()
    ) -> None:
        self.by_key = {route_key(r): r for r in table}
        self._by_plain = {(r.method, r.plain): r for r in self.by_key.values()}
        self.makes = frozenset(route_key(self.of(f)) for f in making)
        self.acts = frozenset(route_key(self.of(f)) for f in forms) - self.makes

    def of(self, form: Form) -> Route:
        """The Route record a form sends (KeyError: it names none)."""
        return self.by_key[f"{form.method} {form.path}"]

    def get(self, method: str, plain: str) -> Route | None:
        """The route with this method and plain path, if the table has it."""
        return self._by_plain.get((method, plain))


# The models page's forms, per model: stop, start (serve), context, longest answer, restart,
# price, remove.
MODEL_FORMS: tuple[Form, ...] = (
    Form("POST", "/models/{name}/stop", "Stop"),
    Form("POST", "/models/{name}/serve", "Start", (Field("body.replicas", "Replicas"),)),
    Form(
        "PUT",
        "/models/{name}/context",
        "Set context",
        (Field("body.context", "Context (tokens; 0: the model's own)"),),
    ),
    Form(
        "PUT",
        "/models/{name}/max_tokens",
        "Set longest answer",
        (Field("body.max_tokens", "Longest answer (tokens; 0: the context)"),),
    ),
    Form("POST", "/models/{name}/restart", "Restart"),
    Form(
        "PUT",
        "/models/{name}/price",
        "Set price",
        (
            Field("body.prompt", "Prompt, per million tokens", step="any"),
            Field("body.completion", "Completion, per million tokens", step="any"),
        ),
    ),
    Form(
        "DELETE",
        "/models/{name}",
        "Remove",
        (Field("query.files", "with its files", "checkbox", "true"),),
        danger=True,
    ),
)


# The serve form's: a model put in the catalog (what `llmgw model add` sends); the inputs are
# the serve page's (serve.html), the preview's values carried on.
ADD_FORM = Form("POST", "/models", "Add to the catalog")
# Then its replicas started (`llmgw model serve`), from the preview or the model card.
SERVE_FORM = Form("POST", "/models/{name}/serve", "Serve", (Field("body.replicas", "Replicas"),))
# The model card's, per profile: its replicas (`llmgw model replicas --profile`); and a new one.
PROFILE_FORM = Form(
    "POST",
    "/models/{name}/replicas",
    "Set replicas",
    (Field("body.profile", "Profile", "hidden"), Field("body.replicas", "Replicas")),
)
# A gpu profile's, in PROFILE_FORM's place (the same route): its replicas and its cards a
# replica (`llmgw model replicas --gpus`).
GPU_PROFILE_FORM = Form(
    "POST",
    "/models/{name}/replicas",
    "Set replicas and cards",
    (
        Field("body.profile", "Profile", "hidden"),
        Field("body.replicas", "Replicas"),
        Field("body.gpus", "Cards a replica"),
    ),
)
NEW_PROFILE_FORM = Form(
    "POST",
    "/models/{name}/replicas",
    "Add profile",
    (
        Field("body.profile", "New profile's name", "text"),
        Field("body.kind", "Kind: cpu or gpu (blank: gpu if its name starts so)", "text"),
        Field("body.replicas", "Replicas", value="1"),
    ),
)
SERVE_FORMS: tuple[Form, ...] = (ADD_FORM, SERVE_FORM, PROFILE_FORM, NEW_PROFILE_FORM)

# The nodes page's forms, per node: cordon, drain, uncordon, remove.
_FLAGS = "/nodes/{name}/{action:cordon|drain|uncordon}"
NODE_FORMS: tuple[Form, ...] = (
    *(
        Form("POST", _FLAGS, a.title(), fixed={"action": a})
        for a in ("cordon", "drain", "uncordon")
    ),
    Form("DELETE", "/nodes/{name}", "Remove", danger=True),
)


# The models page's providers section (`llmgw provider add|remove`): a provider added, its
# credential in a password input, sent once and never drawn again; and, per provider, removed,
# its button sent only with the confirming box ticked (the box goes to no route).
PROVIDER_ADD_FORM = Form(
    "POST",
    "/providers",
    "Add provider",
    (
        Field("body.name", "Name in the catalog", "text", required=True),
        Field("body.protocol", "Protocol: openai or anthropic", "text", "openai", required=True),
        Field("body.url", "URL of its API (https://)", "url", required=True),
        Field("body.model", "Upstream model's name", "text", required=True),
        Field("body.credential", "Credential (API key)", "password", required=True),
        Field("body.context", "Context (tokens; 0: unknown)"),
        Field("body.max_tokens", "Longest answer (tokens; 0: the context)"),
    ),
)
PROVIDER_REMOVE_FORM = Form(
    "DELETE",
    "/providers/{name}",
    "Remove provider",
    (Field("confirm", "Yes, remove it and its credential", "checkbox", "yes", required=True),),
    danger=True,
)
PROVIDER_FORMS: tuple[Form, ...] = (PROVIDER_ADD_FORM, PROVIDER_REMOVE_FORM)


def model_values(
    replicas: int, context: int, prompt: float, completion: float, max_tokens: int = 0
) -> dict[str, str]:
    """The models page's inputs as a model has them now."""
    return {
        "body.replicas": str(max(replicas, 1)),
        "body.context": str(context),
        "body.max_tokens": str(max_tokens),
        "body.prompt": f"{prompt:g}",
        "body.completion": f"{completion:g}",
    }


async def drawn(
    who: auth.Principal,
    routes: Routes,
    forms: Sequence[Form],
    params: Mapping[str, str],
    roles: auth.Roles,
    values: Mapping[str, str] | None = None,
) -> list[Drawn]:
    """The forms of forms who may send with these path parameters, in order."""
    out = []
    for form in forms:
        route = routes.of(form)
        path = {**params, **form.fixed}
        if await auth.allowed(who, route.rule, path, roles):
            out.append(Drawn(form, route, path, values or {}))
    return out
