"""Declaring workflows: every mistake is refused at registration, naming what is wrong."""

from __future__ import annotations

import pytest

from sas_app import SasApp, Step, Workflow, WorkflowDefinitionError


@pytest.fixture
def app(settings):
    app = SasApp(settings)
    app.agent("svc").action(lambda call: {}, name="work")
    app.agent("svc").undo(lambda call: {}, name="undo")
    yield app
    app.store.dispose()


@pytest.mark.parametrize(
    ("steps", "problem"),
    [
        ([], "has no steps"),
        ([Step("a", "nope.work")], "unknown agent action 'nope.work'"),
        ([Step("a", "svc.missing")], "unknown agent action 'svc.missing'"),
        ([Step("a", "svc.work", compensate="svc.gone")], "unknown agent action 'svc.gone' for compensate"),
        ([Step("a", "svc.work"), Step("a", "svc.work")], "duplicate step name 'a'"),
        ([Step("a", "svc.work", timeout=0)], "timeout must be a positive number"),
        ([Step("a", "svc.work", timeout=-1.5)], "timeout must be a positive number"),
        ([Step("a", "svc.work", timeout="10")], "timeout must be a positive number"),  # type: ignore[arg-type]
        ([Step("a", "svc.work", timeout=float("nan"))], "timeout must be a positive number"),
        ([Step("a", "svc.work", timeout=7200)], "visibility timeout"),
        ([Step("a", "svc.work", max_failures=0)], "max_failures must be an integer >= 1"),
        ([Step("bad name", "svc.work")], "step name 'bad name' is not a valid name"),
    ],
)
def test_a_mistake_is_refused_when_the_workflow_is_registered(app, steps, problem):
    with pytest.raises(WorkflowDefinitionError, match=problem.replace("(", r"\(").replace(".", r"\.")):
        app.register(Workflow("wf", steps))
    assert "wf" not in app.workflows


def test_a_bad_workflow_name_and_a_second_registration_are_refused(app):
    with pytest.raises(WorkflowDefinitionError, match="workflow name"):
        app.register(Workflow("no spaces please", [Step("a", "svc.work")]))
    app.register(Workflow("wf", [Step("a", "svc.work", compensate="svc.undo")]))
    with pytest.raises(WorkflowDefinitionError, match="already registered"):
        app.register(Workflow("wf", [Step("a", "svc.work")]))


def test_sas_workflow_takes_every_option_a_workflow_has_and_passes_it_on(app):
    """``sas.workflow(...)`` spells out ``Workflow``'s options (an editor shows them, a type checker
    refuses a misspelled one): none missing, each reaching the workflow."""
    import dataclasses
    import inspect

    options = set(inspect.signature(app.workflow).parameters) - {"name", "steps"}
    assert options == {f.name for f in dataclasses.fields(Workflow)} - {"name", "steps"}
    wf = app.workflow("wf", [Step("a", "svc.work")], description="d", version="v1", deadline=60,
                      concurrency_key="customer", max_running=2)
    assert (wf.description, wf.version, wf.deadline, wf.concurrency_key, wf.max_running) == (
        "d", "v1", 60, "customer", 2)


def test_steps_may_name_actions_by_object_or_by_string(app):
    action = app.agents["svc"].actions["work"]
    wf = app.register(Workflow("wf", [Step("a", action), Step("b", "svc.work")]))
    assert [(s.agent, s.action_name) for s in wf.steps] == [("svc", "work"), ("svc", "work")]


def test_steps_refer_to_each_other_by_object_and_durations_take_timedelta(app):
    from datetime import timedelta

    from sas_app import ChildRun, Sleep, WaitFor

    first = Step("first", "svc.work", timeout=timedelta(seconds=7))
    side = Step("side", "svc.work", after=[])
    fan = Step("fan", "svc.work", for_each=first.output("items"), after=[first, side])
    nap = Sleep("nap", timedelta(minutes=2))
    wait = WaitFor("wait", "approval", timeout=timedelta(hours=1))
    kid = app.register(Workflow("kid", [Step("k", "svc.work")]))
    child = ChildRun("child", kid)
    wf = app.register(Workflow("wf", [first, side, fan, nap, wait, child]))

    assert [(s.name, s.after, s.for_each) for s in wf.specs[:3]] == [
        ("first", None, None), ("side", [], None), ("fan", ["first", "side"], "first.items")]
    assert (wf.specs[0].timeout, wf.specs[3].sleep, wf.specs[4].timeout, wf.specs[5].child) == (7.0, 120.0, 3600.0,
                                                                                                 "kid")
    # the same graph written with names is the same definition: the same version
    named = Workflow("wf2", [Step("first", "svc.work", timeout=7), Step("side", "svc.work", after=[]),
                             Step("fan", "svc.work", for_each="first.items", after=["first", "side"]),
                             Sleep("nap", 120), WaitFor("wait", "approval", timeout=3600), ChildRun("child", "kid")])
    assert named.run_version == wf.run_version


def test_a_step_referring_to_one_outside_its_workflow_is_refused_naming_it(app):
    elsewhere = Step("elsewhere", "svc.work")
    with pytest.raises(WorkflowDefinitionError, match="elsewhere"):
        app.register(Workflow("wf", [Step("a", "svc.work"), Step("b", "svc.work", after=[elsewhere])]))
    with pytest.raises(WorkflowDefinitionError, match="elsewhere"):
        app.register(Workflow("wf", [Step("a", "svc.work"), Step("b", "svc.work", for_each=elsewhere.output("x"))]))
    assert "wf" not in app.workflows


def test_after_takes_a_list_not_one_name(app):
    with pytest.raises(WorkflowDefinitionError, match="after= takes a list of steps"):
        Workflow("wf", [Step("a", "svc.work"), Step("b", "svc.work", after="a")])


@pytest.mark.parametrize("by_name", [False, True])
def test_an_undo_is_not_a_step_s_action(app, by_name):
    undo = "svc.undo" if by_name else app.agents["svc"].actions["undo"]
    with pytest.raises(WorkflowDefinitionError, match=r"step 'a': its action 'svc\.undo' is an undo \(@agent\.undo\)"):
        app.register(Workflow("wf", [Step("a", undo)]))  # type: ignore[arg-type]
    assert "wf" not in app.workflows


@pytest.mark.parametrize("by_name", [False, True])
def test_an_action_is_not_a_step_s_undo(app, by_name):
    """An action called as an undo would apply its effect a second time (a second charge) and
    the run would end ``compensated`` as if it had been undone."""
    action = "svc.work" if by_name else app.agents["svc"].actions["work"]
    with pytest.raises(WorkflowDefinitionError,
                       match=r"step 'a': its compensate 'svc\.work' is an action \(@agent\.action\), which would "
                             r"apply its effect a second time; declare what undoes it with @agent\.undo"):
        app.register(Workflow("wf", [Step("a", "svc.work", compensate=action)]))  # type: ignore[arg-type]
    assert "wf" not in app.workflows


def test_an_action_name_cannot_be_registered_twice(app):
    with pytest.raises(WorkflowDefinitionError, match="already has an action 'work'"):
        app.agent("svc").action(lambda call: {}, name="work")


def test_each_app_has_its_own_registry_and_tasks(settings):
    one, two = SasApp(settings), SasApp(settings)
    one.agent("a").action(lambda call: {"app": 1}, name="x")
    assert "sas.agent.a.x" in one.celery.tasks
    assert "sas.agent.a.x" not in two.celery.tasks
    assert two.agents == {} and two.workflows == {}
    one.store.dispose()
    two.store.dispose()


def test_a_condition_on_a_step_that_does_not_exist_or_is_not_waited_for_is_refused(app):
    from sas_app import Output

    first = Step("first", "svc.work")
    cases = [
        ([first, Step("b", "svc.work", when=Output("nowhere", "ok"))], "'nowhere.ok' names no step of this workflow"),
        ([first, Step("b", "svc.work", after=[], unless=first.output("ok"))],
         "'first.ok' reads the result of 'first', which it does not wait for (add it to after=)"),
        ([first, Step("b", "svc.work", when="not a key")], "a condition names a payload key"),
    ]
    for steps, problem in cases:
        with pytest.raises(WorkflowDefinitionError, match=problem.replace("(", r"\(").replace(")", r"\)")):
            app.register(Workflow("wf", steps))
    with pytest.raises(WorkflowDefinitionError, match="give when= or unless=, not both"):
        Workflow("wf", [Step("a", "svc.work", when="x", unless="y")])
    with pytest.raises(WorkflowDefinitionError, match="when= takes a payload key"):
        Workflow("wf", [Step("a", "svc.work", when=42)])  # type: ignore[arg-type]
    assert "wf" not in app.workflows


def test_a_condition_is_part_of_the_definition_s_version(app):
    def big(step) -> bool:
        return bool(step.payload["amount"] > 100)

    def huge(step) -> bool:
        return bool(step.payload["amount"] > 1000)

    def version(**condition) -> str:
        return Workflow("wf", [Step("a", "svc.work"), Step("b", "svc.work", **condition)]).run_version

    plain = version()
    assert len({plain, version(when=big), version(unless=big), version(when=huge), version(when="vip"),
                version(when=Step("a", "svc.work").output("vip"))}) == 6
    assert version(when=big) == version(when=big)  # the same condition: the same version
    assert not Workflow("wf", [Step("a", "svc.work", when="vip")]).is_linear  # left to the planner
