"""From a validated identity to a member's session, against the real database (migration
0031): who a verified email or a bound subject names, what binding on the first sign-in
changes, what an admin's change of address undoes, the session token as a credential of that
member and its end, the one-use sign-in flows, and that none of it is open to anyone signed
in as an owner, a member or an agent (only the dispatcher, before anyone is signed in)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final
from uuid import UUID

import psycopg
import pytest

from toolrelay.db import Database
from toolrelay.registry import Registry
from toolrelay.registry.members import Members
from toolrelay.signin import AmbiguousMember, Identity, SignInError, SignIns, Started
from toolrelay.signin.sessions import (
    CLI_SESSION_S,
    FLOW_TTL_S,
    PAGE_SESSION_S,
    Flow,
    Session,
    state_hash,
)
from toolrelay.tokens import (
    Authenticator,
    Caller,
    TokenStore,
    Unauthenticated,
    hash_token,
    new_token,
)

ISSUER: Final = "https://idp.example.test"
OTHER_ISSUER: Final = "https://other-idp.example.test"


def address(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}@example.test"


def subject() -> str:
    return f"sub-{uuid.uuid4().hex}"


def person(sub: str, email: str | None, verified: bool = True, issuer: str = ISSUER) -> Identity:
    return Identity(issuer=issuer, subject=sub, email=email, email_verified=verified, name=None)


@dataclass
class Tenant:
    db: Database
    owner: UUID
    members: Members

    def add(self, name: str, role: str = "approver", email: str | None = None) -> UUID:
        return self.members.add(self.owner, name, role, email).id

    def binding(self, member_id: UUID) -> tuple[str | None, str | None]:
        with self.db.as_owner(self.owner) as conn:
            row = conn.execute(
                "SELECT oidc_subject, oidc_issuer FROM agents.members WHERE id = %s",
                (member_id,),
            ).fetchone()
        assert row is not None
        return row["oidc_subject"], row["oidc_issuer"]

    def set_email(self, member_id: UUID, email: str | None, as_member: UUID | None = None) -> None:
        """public.fn_set_member_email as the tenant (its first admin) or one of its members."""
        with self.db.as_owner(self.owner, member_id=as_member) as conn:
            conn.execute("SELECT fn_set_member_email(%s, %s)", (member_id, email))


@pytest.fixture
def new_tenant(db: Database) -> Callable[[], Tenant]:
    return lambda: Tenant(db, uuid.uuid4(), Members(db))


@pytest.fixture
def tenant(new_tenant: Callable[[], Tenant]) -> Tenant:
    return new_tenant()


@pytest.fixture
def signins(db: Database) -> SignIns:
    return SignIns(db)


def db_now(db: Database) -> datetime:
    with db.as_dispatcher() as conn:
        row = conn.execute("SELECT now() AS now").fetchone()
    assert row is not None
    now: datetime = row["now"]
    return now


# --- who a sign-in names -------------------------------------------------------------------


def test_the_first_verified_sign_in_binds_subject_and_issuer(
    tenant: Tenant, signins: SignIns
) -> None:
    email, sub = address("ada"), subject()
    ada = tenant.add("Ada", "approver", email)
    assert tenant.binding(ada) == (None, None)
    [match] = signins.members_for(person(sub, email), None)
    assert (match.owner, match.member_id, match.name, match.role, match.bound) == (
        tenant.owner,
        ada,
        "Ada",
        "approver",
        False,
    )

    session = signins.sign_in(person(sub, email), None, "page")
    assert (session.owner, session.member_id, session.name, session.role) == (
        tenant.owner,
        ada,
        "Ada",
        "approver",
    )
    assert tenant.binding(ada) == (sub, ISSUER)
    [match] = signins.members_for(person(sub, email), None)
    assert (match.member_id, match.bound) == (ada, True)


def test_after_binding_another_subject_with_the_same_email_does_not_match(
    tenant: Tenant, signins: SignIns
) -> None:
    """The provider gives the address to someone else later (a recycled mailbox): they are
    not the member who signed in with it first."""
    email, first = address("ada"), subject()
    ada = tenant.add("Ada", "approver", email)
    signins.sign_in(person(first, email), None, "page")
    newcomer = person(subject(), email)
    assert signins.members_for(newcomer, None) == []
    with pytest.raises(SignInError, match=f"no member here signs in as {email}"):
        signins.sign_in(newcomer, None, "page")
    assert tenant.binding(ada) == (first, ISSUER)


def test_the_bound_subject_with_a_changed_email_still_matches(
    tenant: Tenant, signins: SignIns
) -> None:
    email, sub = address("ada"), subject()
    ada = tenant.add("Ada", "approver", email)
    signins.sign_in(person(sub, email), None, "page")
    for changed in (
        person(sub, address("ada.new")),
        person(sub, address("x"), verified=False),
        person(sub, None),
    ):
        [match] = signins.members_for(changed, None)
        assert (match.member_id, match.bound) == (ada, True)
        assert signins.sign_in(changed, None, "page").member_id == ada
    assert tenant.binding(ada) == (sub, ISSUER)


def test_a_bound_subject_from_another_issuer_does_not_match(
    tenant: Tenant, signins: SignIns
) -> None:
    email, sub = address("ada"), subject()
    tenant.add("Ada", "approver", email)
    signins.sign_in(person(sub, email), None, "page")
    assert signins.members_for(person(sub, email, issuer=OTHER_ISSUER), None) == []


def test_an_unverified_email_never_matches(tenant: Tenant, signins: SignIns) -> None:
    email = address("ada")
    ada = tenant.add("Ada", "approver", email)
    unverified = person(subject(), email, verified=False)
    assert signins.members_for(unverified, None) == []
    assert signins.members_for(unverified, tenant.owner) == []
    with pytest.raises(SignInError, match=f"not verified {email}"):
        signins.sign_in(unverified, tenant.owner, "page")
    assert tenant.binding(ada) == (None, None)  # and nothing was bound
    with pytest.raises(SignInError, match="did not share an email"):
        signins.sign_in(person(subject(), None), None, "page")


def test_the_verified_email_matches_whatever_its_case(tenant: Tenant, signins: SignIns) -> None:
    email = address("Ada.Lovelace")
    ada = tenant.add("Ada", "approver", email)
    assert signins.sign_in(person(subject(), email.upper()), None, "page").member_id == ada


def test_a_removed_member_does_not_match(tenant: Tenant, signins: SignIns, db: Database) -> None:
    email, sub = address("gone"), subject()
    gone = tenant.add("Gone", "approver", email)
    session = signins.sign_in(person(sub, email), None, "page")
    unbound_email = address("never-signed-in")
    never = tenant.add("Never", "viewer", unbound_email)
    assert tenant.members.remove(tenant.owner, gone)
    assert tenant.members.remove(tenant.owner, never)

    assert signins.members_for(person(sub, email), None) == []  # by subject
    assert signins.members_for(person(subject(), unbound_email), None) == []  # by email
    with pytest.raises(SignInError, match="no member here"):
        signins.sign_in(person(sub, email), None, "page")
    with pytest.raises(Unauthenticated):  # removing revoked the session
        Authenticator(db).authenticate(session.token)

    # Added again (a new member row), the same person binds to the new member.
    again = tenant.add("Back", "viewer", email)
    back = signins.sign_in(person(sub, email), None, "page")
    assert (back.member_id, back.role) == (again, "viewer")
    assert tenant.binding(again) == (sub, ISSUER)


def test_the_same_person_in_two_tenants_chooses_one(
    new_tenant: Callable[[], Tenant], signins: SignIns
) -> None:
    email, sub = address("both"), subject()
    first, second = new_tenant(), new_tenant()
    in_first = first.add("Both", "approver", email)
    in_second = second.add("Both", "viewer", email)
    who = person(sub, email)

    with pytest.raises(AmbiguousMember, match="member of 2 organizations") as caught:
        signins.sign_in(who, None, "page")
    assert {(m.owner, m.member_id) for m in caught.value.matches} == {
        (first.owner, in_first),
        (second.owner, in_second),
    }
    assert (first.binding(in_first), second.binding(in_second)) == ((None, None), (None, None))

    chosen = signins.sign_in(who, second.owner, "page")
    assert (chosen.owner, chosen.member_id, chosen.role) == (second.owner, in_second, "viewer")
    assert second.binding(in_second) == (sub, ISSUER)
    assert first.binding(in_first) == (None, None)  # binding one tenant's member binds no other

    [only] = signins.members_for(who, first.owner)
    assert (only.member_id, only.bound) == (in_first, False)
    assert signins.sign_in(who, first.owner, "page").member_id == in_first
    with pytest.raises(AmbiguousMember):  # both bound now, still two organizations
        signins.sign_in(who, None, "page")
    # Naming a tenant the person is not in finds nobody, not the other tenant's member.
    with pytest.raises(SignInError, match="no member here"):
        signins.sign_in(who, uuid.uuid4(), "page")


def test_a_member_added_by_subject_is_pinned_to_the_first_issuer(
    tenant: Tenant, signins: SignIns
) -> None:
    """public.fn_add_member(name, role, email, subject) (an admin through SQL or the REST
    API) binds a subject without an issuer; the first sign-in as it records the issuer, so
    the same subject string at another provider (a changed TOOLRELAY_OIDC_ISSUER) is not
    this member."""
    sub = subject()
    with tenant.db.as_owner(tenant.owner) as conn:
        row = conn.execute(
            "SELECT fn_add_member('By Subject', 'approver', NULL, %s) AS id", (sub,)
        ).fetchone()
    assert row is not None
    member: UUID = row["id"]
    assert tenant.binding(member) == (sub, None)
    assert signins.sign_in(person(sub, None), None, "page").member_id == member
    assert tenant.binding(member) == (sub, ISSUER)
    assert signins.members_for(person(sub, None, issuer=OTHER_ISSUER), None) == []


# --- binding races -------------------------------------------------------------------------


def test_fn_oidc_bind_binds_once(tenant: Tenant, db: Database) -> None:
    ada = tenant.add("Ada", "approver", address("ada"))
    gone = tenant.add("Gone", "viewer", address("gone"))
    tenant.members.remove(tenant.owner, gone)
    first, second = subject(), subject()

    def bind(member: UUID, issuer: str, sub: str) -> bool:
        with db.as_dispatcher() as conn:
            row = conn.execute(
                "SELECT agents.fn_oidc_bind(%s, %s, %s) AS bound", (member, issuer, sub)
            ).fetchone()
        assert row is not None
        return bool(row["bound"])

    assert bind(ada, ISSUER, first)
    assert not bind(ada, ISSUER, second)  # bound meanwhile to someone else
    assert bind(ada, ISSUER, first)  # the same binding again: still this one
    assert not bind(ada, OTHER_ISSUER, first)
    assert not bind(gone, ISSUER, subject())
    assert not bind(uuid.uuid4(), ISSUER, subject())
    assert tenant.binding(ada) == (first, ISSUER)


def test_a_binding_made_while_signing_in_is_not_overwritten(
    tenant: Tenant, signins: SignIns, db: Database
) -> None:
    """Two people with the same verified address (a shared mailbox) sign in at once: the
    one whose bind waits on the other's finds the member taken, and is refused."""
    email, winner, loser = address("shared"), subject(), subject()
    member = tenant.add("Shared", "approver", email)
    result: list[Session | BaseException] = []
    with db.connect() as other:  # the winner's bind, held uncommitted: the row is locked
        other.execute("SELECT agents.fn_oidc_bind(%s, %s, %s)", (member, ISSUER, winner))

        def sign_in() -> None:
            try:
                result.append(signins.sign_in(person(loser, email), None, "page"))
            except BaseException as exc:
                result.append(exc)

        thread = threading.Thread(target=sign_in)
        thread.start()
        _until_a_backend_waits_on_a_lock(db, other)
        other.commit()
        thread.join()
    [outcome] = result
    assert isinstance(outcome, SignInError)
    assert "bound to another sign-in meanwhile" in str(outcome)
    assert tenant.binding(member) == (winner, ISSUER)


def _until_a_backend_waits_on_a_lock(db: Database, holder: psycopg.Connection[Any]) -> None:
    """Until some backend is blocked by ``holder``'s transaction (polled by query)."""
    deadline = time.monotonic() + 30
    with db.connect(autocommit=True) as watch:
        while time.monotonic() < deadline:
            row = watch.execute(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE %s = ANY (pg_blocking_pids(pid))",
                (holder.info.backend_pid,),
            ).fetchone()
            if row is not None and row["n"]:
                return
    raise AssertionError("the sign-in never reached the locked member row")


# --- an admin's change of address ----------------------------------------------------------


def test_an_admin_changing_the_email_clears_the_binding(tenant: Tenant, signins: SignIns) -> None:
    old, new, first, second = address("old"), address("new"), subject(), subject()
    member = tenant.add("Person", "approver", old)
    signins.sign_in(person(first, old), None, "page")
    assert tenant.binding(member) == (first, ISSUER)

    tenant.set_email(member, f"  {new}  ")
    assert tenant.binding(member) == (None, None)
    assert tenant.members.get(tenant.owner, member).email == new
    assert signins.members_for(person(first, old), None) == []  # the old address is gone

    session = signins.sign_in(person(second, new), None, "page")  # binds anew
    assert session.member_id == member
    assert tenant.binding(member) == (second, ISSUER)
    assert signins.members_for(person(first, new), None) == []  # the first subject is out

    tenant.set_email(member, None)  # no email: nobody signs in as it by address
    assert tenant.members.get(tenant.owner, member).email is None
    assert tenant.binding(member) == (None, None)
    assert signins.members_for(person(subject(), new), None) == []
    assert signins.members_for(person(second, new), None) == []


def test_only_an_admin_of_the_tenant_changes_an_email(
    new_tenant: Callable[[], Tenant], signins: SignIns, db: Database
) -> None:
    tenant, stranger = new_tenant(), new_tenant()
    email, sub = address("target"), subject()
    agent = Registry(db, tenant.owner).create_agent("bot")
    target = tenant.add("Target", "viewer", email)
    approver = tenant.add("Approver", "approver")
    admin = tenant.add("Admin", "admin")
    stranger.add("Stranger's first member", "admin")
    signins.sign_in(person(sub, email), None, "page")

    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="needs the admin role"):
        tenant.set_email(target, address("attacker"), as_member=approver)
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="an agent identity"),
        db.as_owner(tenant.owner, agent_id=agent) as conn,
    ):
        conn.execute("SELECT fn_set_member_email(%s, %s)", (target, address("attacker")))
    with pytest.raises(psycopg.errors.NoDataFound, match="not found"):
        stranger.set_email(target, address("attacker"))
    assert tenant.binding(target) == (sub, ISSUER)  # none of that changed anything

    tenant.set_email(target, address("fine"), as_member=admin)
    assert tenant.binding(target) == (None, None)


# --- the session ---------------------------------------------------------------------------


@pytest.mark.parametrize(("kind", "ttl"), [("page", PAGE_SESSION_S), ("cli", CLI_SESSION_S)])
def test_a_session_token_authenticates_as_the_member(
    tenant: Tenant, signins: SignIns, db: Database, kind: str, ttl: int
) -> None:
    email = address("ada")
    ada = tenant.add("Ada", "approver", email)
    before = db_now(db)
    session = signins.sign_in(person(subject(), email), None, kind)
    after = db_now(db)
    caller = Authenticator(db).authenticate(session.token)
    assert caller == Caller(owner=tenant.owner, member_id=ada, token_id=session.token_id)
    assert tenant.members.role_of(caller) == "approver"
    assert before + timedelta(seconds=ttl) <= session.expires_at <= after + timedelta(seconds=ttl)

    [info] = [t for t in TokenStore(db).list(tenant.owner) if t.id == session.token_id]
    assert (info.member_id, info.name, info.expires_at) == (
        ada,
        f"signed in ({kind})",
        session.expires_at,
    )
    assert session.token not in repr(info)  # only its hash is kept


def test_each_sign_in_is_its_own_session(tenant: Tenant, signins: SignIns, db: Database) -> None:
    email, sub = address("ada"), subject()
    tenant.add("Ada", "approver", email)
    one = signins.sign_in(person(sub, email), None, "page")
    two = signins.sign_in(person(sub, email), None, "page")
    assert one.token != two.token and one.token_id != two.token_id
    assert signins.sign_out(one.token)
    assert Authenticator(db).authenticate(two.token).token_id == two.token_id


def test_a_session_past_its_expiry_does_not_authenticate(tenant: Tenant, db: Database) -> None:
    member = tenant.add("Ada", "approver", address("ada"))
    token = new_token()
    with db.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT * FROM agents.fn_signin_session(%s, %s, 'page', 0)",
            (member, hash_token(token)),
        ).fetchone()
    assert row is not None and row["owner"] == tenant.owner
    with pytest.raises(Unauthenticated, match="unknown, revoked or expired"):
        Authenticator(db).authenticate(token)


def test_sign_out_revokes_the_session_and_nothing_else(
    tenant: Tenant, signins: SignIns, db: Database
) -> None:
    email = address("ada")
    ada = tenant.add("Ada", "approver", email)
    session = signins.sign_in(person(subject(), email), None, "page")
    store = TokenStore(db)
    _, pasted = store.create(tenant.owner, member_id=ada, name="script")  # token create --member
    _, owners = store.create(tenant.owner)
    auth = Authenticator(db)

    assert signins.sign_out(session.token) is True
    with pytest.raises(Unauthenticated):
        auth.authenticate(session.token)
    assert signins.sign_out(session.token) is False  # already signed out

    for token in (pasted, owners):
        assert signins.sign_out(token) is False
        assert auth.authenticate(token).owner == tenant.owner  # still valid
    assert signins.sign_out(new_token()) is False  # a token nobody has


# --- the flows -----------------------------------------------------------------------------


def started(state: str | None = None) -> Started:
    return Started(
        url="https://idp.example.test/authorize?...",
        state=state or f"state-{uuid.uuid4().hex}",
        nonce=f"nonce-{uuid.uuid4().hex}",
        code_verifier=f"verifier-{uuid.uuid4().hex}{uuid.uuid4().hex}",
        redirect_uri="https://relay.example.test/approvals/oidc/callback",
    )


def test_a_flow_is_used_once(signins: SignIns, tenant: Tenant, db: Database) -> None:
    flow = started()
    signins.remember(flow, tenant.owner)
    assert signins.consume(flow.state) == Flow(
        tenant.owner, flow.nonce, flow.code_verifier, flow.redirect_uri
    )
    with pytest.raises(SignInError, match="already used"):
        signins.consume(flow.state)
    anonymous = started()
    signins.remember(anonymous, None)
    assert signins.consume(anonymous.state).owner is None


def test_only_the_states_hash_is_kept(signins: SignIns, db: Database) -> None:
    flow = started()
    signins.remember(flow, None)
    with db.connect() as conn:  # the table is the functions' alone, the dispatcher's too
        rows = conn.execute(
            "SELECT state_hash, expires_at - created_at AS ttl FROM agents.signin_flows"
            " WHERE state_hash = %s OR state_hash = %s",
            (state_hash(flow.state), flow.state.encode()),
        ).fetchall()
    assert [bytes(r["state_hash"]) for r in rows] == [state_hash(flow.state)]
    assert rows[0]["ttl"] == timedelta(seconds=FLOW_TTL_S)
    with pytest.raises(psycopg.errors.InsufficientPrivilege), db.as_dispatcher() as conn:
        conn.execute("SELECT nonce, code_verifier FROM agents.signin_flows")


def test_a_replayed_callback_racing_the_real_one_wins_nothing(signins: SignIns) -> None:
    """The same state consumed by eight requests at once: exactly one gets the flow."""
    flow = started()
    signins.remember(flow, None)
    gate = threading.Barrier(8)

    def consume(_: int) -> Flow | str:
        gate.wait()
        try:
            return signins.consume(flow.state)
        except SignInError as exc:
            return str(exc)

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(consume, range(8)))
    assert sum(isinstance(o, Flow) for o in outcomes) == 1
    assert all("already used" in o for o in outcomes if isinstance(o, str))


def test_an_expired_flow_is_refused(signins: SignIns, db: Database) -> None:
    state = f"state-{uuid.uuid4().hex}"
    with db.as_dispatcher() as conn:
        conn.execute(
            "SELECT agents.fn_signin_begin(%s, 'page', NULL, 'n', 'v', 'https://r.example', 0)",
            (state_hash(state),),
        )
    with pytest.raises(SignInError, match="took too long and expired"):
        signins.consume(state)


def test_an_unknown_state_or_another_purpose_was_not_started_here(signins: SignIns) -> None:
    with pytest.raises(SignInError, match="not started here"):
        signins.consume(f"state-{uuid.uuid4().hex}")
    flow = started()
    signins.remember(flow, None, purpose="page")
    with pytest.raises(SignInError, match="not started here"):
        signins.consume(flow.state, purpose="elsewhere")
    with pytest.raises(SignInError, match="not started here"):  # a state's hash is no state
        signins.consume(state_hash(flow.state).hex())
    assert signins.consume(flow.state).nonce == flow.nonce  # still there for its own purpose


# --- nobody signed in may call any of it ---------------------------------------------------

DISPATCHER_ONLY: Final[dict[str, str]] = {
    "fn_signin_begin": "SELECT agents.fn_signin_begin(%(hash)s, 'page', NULL, 'n', 'v', 'r', 600)",
    "fn_signin_consume": "SELECT * FROM agents.fn_signin_consume(%(hash)s, 'page')",
    "fn_oidc_members": "SELECT * FROM agents.fn_oidc_members('i', 's', %(email)s, true, NULL)",
    "fn_oidc_bind": "SELECT agents.fn_oidc_bind(%(member)s, 'https://evil.example', 's')",
    "fn_signin_session": "SELECT * FROM agents.fn_signin_session(%(member)s, %(hash)s, 'page', 86400)",
    "fn_signout": "SELECT agents.fn_signout(%(hash)s)",
    "the flows table": "SELECT * FROM agents.signin_flows",
}


@dataclass
class Team:
    tenant: Tenant
    agent: UUID
    admin: UUID
    target: UUID
    email: str


@pytest.fixture
def team(tenant: Tenant, db: Database) -> Team:
    agent = Registry(db, tenant.owner).create_agent("bot")
    email = address("target")
    return Team(
        tenant, agent, tenant.add("Admin", "admin"), tenant.add("T", "viewer", email), email
    )


def _identity(team: Team, who: str) -> dict[str, Any]:
    return {
        "the tenant": {},
        "an admin member": {"member_id": team.admin},
        "the signed-in member": {"member_id": team.target},
        "an agent": {"agent_id": team.agent},
    }[who]


@pytest.mark.parametrize(
    "who", ["the tenant", "an admin member", "the signed-in member", "an agent"]
)
@pytest.mark.parametrize("what", list(DISPATCHER_ONLY))
def test_no_owner_member_or_agent_may_call_the_sign_in_functions(
    team: Team, db: Database, who: str, what: str
) -> None:
    params = {"hash": state_hash("x"), "email": team.email, "member": team.target}
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"),
        db.as_owner(team.tenant.owner, **_identity(team, who)) as conn,
    ):
        conn.execute(DISPATCHER_ONLY[what], params)
    assert team.tenant.binding(team.target) == (None, None)


def test_only_the_dispatcher_role_holds_execute(db: Database) -> None:
    """From the catalog: every role that may run these is a superuser or the dispatcher's
    (service_role, or a role in it); PUBLIC and authenticated may not."""
    signatures = [
        "agents.fn_signin_begin(bytea, text, uuid, text, text, text, integer)",
        "agents.fn_signin_consume(bytea, text)",
        "agents.fn_oidc_members(text, text, text, boolean, uuid)",
        "agents.fn_oidc_bind(uuid, text, text)",
        "agents.fn_signin_session(uuid, bytea, text, integer)",
        "agents.fn_signout(bytea)",
    ]
    with db.connect() as conn:
        for signature in signatures:
            rows = conn.execute(
                "SELECT r.rolname FROM pg_roles r"
                " WHERE has_function_privilege(r.oid, %s::regprocedure, 'EXECUTE')"
                "   AND NOT r.rolsuper AND NOT pg_has_role(r.oid, 'service_role', 'USAGE')",
                (signature,),
            ).fetchall()
            assert rows == [], (signature, rows)
            row = conn.execute(
                "SELECT has_function_privilege('service_role', %s::regprocedure, 'EXECUTE') AS ok,"
                " has_function_privilege('authenticated', %s::regprocedure, 'EXECUTE') AS owner",
                (signature, signature),
            ).fetchone()
            assert row is not None and (row["ok"], row["owner"]) == (True, False), signature


def test_an_owner_cannot_make_a_token_look_like_a_session(tenant: Tenant, db: Database) -> None:
    """api_tokens.session (what sign-out revokes) is the dispatcher's to write: an admin's
    token for a member stays a pasted token, and cannot be turned into a session."""
    member = tenant.add("Ada", "approver", address("ada"))
    info, _ = TokenStore(db).create(tenant.owner, member_id=member)
    with db.as_dispatcher() as conn:
        row = conn.execute(
            "SELECT session FROM agents.api_tokens WHERE id = %s", (info.id,)
        ).fetchone()
    assert row is not None and row["session"] is None
    with (
        pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"),
        db.as_owner(tenant.owner) as conn,
    ):
        conn.execute("UPDATE agents.api_tokens SET session = 'page' WHERE id = %s", (info.id,))
