"""The sign-up example, tested with sas_app's kit: each story a sign-up can meet, in milliseconds."""

from examples.signup import HOME, create, delete, greeting, sas, signup, welcome
from sas_app import PermanentError, RunState, TransientError
from sas_app.testing import HANG


def test_a_sign_up_creates_the_account_and_mails_the_welcome_once(sas_env):
    env = sas_env(sas)

    view = env.run(signup, {"email": "ada@example.com"})

    assert view.state is RunState.PROCESSED
    assert view.step(greeting).result == {"mailed": "ada@example.com", "account": f"{view.id}:create_account"}
    assert (HOME / "accounts" / f"{view.id}:create_account").read_text() == "ada@example.com"
    assert [call.try_number for call in env.calls(welcome)] == [1]


def test_a_busy_mail_server_is_tried_again_within_the_same_attempt(sas_env):
    env = sas_env(sas)

    view = env.run(signup, {"email": "bob@example.com", "flaky_mailer": True})

    assert view.state is RunState.PROCESSED
    assert [(c.attempt, c.try_number) for c in env.calls(welcome)] == [(1, 1), (1, 2)]


def test_a_mailer_that_refuses_the_address_undoes_the_account(sas_env):
    env = sas_env(sas)
    env.stub(welcome, raises=PermanentError("mailbox does not exist"))

    view = env.run(signup, {"email": "carol@example.com"})

    assert view.state is RunState.COMPENSATED
    assert len(env.calls(delete)) == 1


def test_the_undo_deletes_the_account_the_step_created(sas_env):
    env = sas_env(sas)
    env.stub(welcome, raises=PermanentError("mailbox does not exist"))

    view = env.run(signup, {"email": "carol@example.com"})

    [undo] = env.calls(delete)
    [made] = env.calls(create)
    assert undo.undoes.idempotency_key == made.idempotency_key and made.run_id == view.id  # the account it deletes
    assert not (HOME / "accounts" / made.idempotency_key).exists()
    assert [alert.kind for alert in env.alerts] == ["failed"]


def test_a_mailer_that_never_answers_is_retried_at_each_complete_by_then_the_account_undone(sas_env):
    env = sas_env(sas)
    env.stub(welcome, sequence=[HANG, TransientError("still down"), HANG, HANG])
    started = env.now

    view = env.run(signup, {"email": "dan@example.com"})

    assert view.state is RunState.COMPENSATED
    calls = env.calls(welcome)
    assert {c.idempotency_key for c in calls} == {f"{view.id}:send_welcome"}  # the same key every attempt
    assert sorted({c.attempt for c in calls}) == [1, 2, 3]  # a new fencing token each
    assert env.now - started >= 3 * 5  # three complete-bys (5 s each) passed, on the virtual clock
    assert len(env.calls(delete)) == 1
