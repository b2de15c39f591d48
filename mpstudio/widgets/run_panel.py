"""RunPanel: where plans run (this process, the local HTP emulator agent, a remote agent or a Ray cluster), on which
backend; evaluate the current plan, or search for a plan that reaches a target."""

from __future__ import annotations

import html

import panel as pn
import param

from ..distributed.cluster import ray_address
from .base import View, laid_out_once, shows_errors
from .jobs import JobsView
from .state import StudioState


class RunPanel(View):
    """Evaluate and search, with a progress bar and a cancel button for each job and errors as messages."""

    state = param.ClassSelector(class_=StudioState)
    ray_address = param.String("auto", doc="the Ray cluster of the 'Ray cluster' runner (auto, HOST:PORT)")

    def __init__(self, **params):
        super().__init__(**params)
        state = self.state
        # One runner a line: four side by side are cut in the sidebar at any window size.
        self._runner = pn.widgets.RadioButtonGroup.from_param(state.param.runner, button_type="light",
                                                              orientation="vertical", sizing_mode="stretch_width",
                                                              css_classes=["mpstudio-runner"])
        agents = state.policy.agents
        if agents is None:  # a notebook: any agent, by URL and token
            self._agent = [pn.widgets.TextInput.from_param(state.param.agent_url, name="Agent URL",
                                                           placeholder="http://device:8765", sizing_mode="stretch_width"),
                           pn.widgets.PasswordInput.from_param(state.param.agent_token, name="Agent token",
                                                               sizing_mode="stretch_width")]
        elif agents:  # a served studio: one of the agents its server names (their token is the server's)
            choice = pn.widgets.Select(name="Agent", options=list(agents), value=state.agent_url,
                                       sizing_mode="stretch_width")
            choice.param.watch(self._on_agent, "value")
            self._agent = [choice]
        else:
            self._agent = [pn.pane.HTML("<span style='font-size:12px;color:#666'>this studio names no remote agent "
                                        "(start it with --agent URL)</span>", sizing_mode="stretch_width")]
        if agents is None:  # a notebook: any cluster by address; a served studio's is its server's
            self.ray_address = state.agents.ray_address
            self._ray = pn.widgets.TextInput.from_param(self.param.ray_address, name="Ray cluster",
                                                        placeholder="auto or HOST:PORT", sizing_mode="stretch_width")
            self.param.watch(self._on_ray_address, "ray_address")
        else:
            named = ray_address() or "auto (a cluster started on the studio's machine; or MPSTUDIO_RAY_ADDRESS)"
            self._ray = pn.pane.HTML(f"<span style='font-size:12px;color:#666'>Ray cluster: {html.escape(named)}"
                                     "</span>", sizing_mode="stretch_width")
        self._backend = pn.widgets.RadioButtonGroup.from_param(state.param.backend, button_type="light")
        self._evaluate = pn.widgets.Button(name="Evaluate current plan", button_type="primary",
                                           sizing_mode="stretch_width")
        self._target = pn.widgets.TextInput.from_param(state.param.target, name="Search target",
                                                       placeholder="a16w8+10% or a metric value",
                                                       sizing_mode="stretch_width")
        self._weights = pn.widgets.RadioButtonGroup.from_param(state.param.search_weights, button_type="light",
                                                               sizing_mode="stretch_width")
        self._search = pn.widgets.Button(name="Search", button_type="success", sizing_mode="stretch_width")
        self._confirm = pn.widgets.Checkbox.from_param(state.param.confirm_search,
                                                       name="Confirm the search's front on HTP")
        self._on_edit = pn.widgets.Checkbox.from_param(state.param.evaluate_on_edit,
                                                       name="Evaluate on promote/demote (predicted point first)")
        self._evaluate.on_click(self._on_evaluate)
        self._search.on_click(self._on_search)
        self._jobs = JobsView(state=state)

    @laid_out_once
    def __panel__(self):
        remote = pn.Column(*self._agent, visible=self.state.param.runner.rx() == "remote",
                           sizing_mode="stretch_width")
        cluster = pn.Column(self._ray, visible=self.state.param.runner.rx() == "ray", sizing_mode="stretch_width")
        plan = pn.bind(self._plan_text, self.state.param.plan, self.state.param.plan_id)
        return pn.Column(
            pn.pane.HTML("<b>Run</b>"), self._runner, remote, cluster,
            pn.Row(pn.pane.HTML("backend", margin=(12, 5)), self._backend),
            pn.pane.HTML(plan, sizing_mode="stretch_width"), self._evaluate, self._on_edit, self._target,
            pn.pane.HTML("<span style='font-size:12px'>search weights</span>", margin=(0, 10)), self._weights,
            self._search,
            self._confirm,
            pn.pane.HTML("<b>Jobs</b>"), self._jobs, sizing_mode="stretch_width",
        )

    def _plan_text(self, plan, plan_id) -> str:
        """The current plan: its id and stored name when the study has it, else what it changes."""
        study = self.state.study
        if plan_id is not None and study is not None:
            text = f"plan {plan_id}: {html.escape(study.plan(plan_id).name)}"
        else:
            text = f"{html.escape(plan.summary())} (not evaluated yet)"
        return f"<div style='font-size:12px'>current plan: <b>{text}</b></div>"

    def _on_ray_address(self, event):
        self.state.agents.ray_address = event.new

    def _on_agent(self, event):
        self.state.agent_url = event.new

    @shows_errors
    def _on_evaluate(self, event):
        self.state.evaluate_plan()

    @shows_errors
    def _on_search(self, event):
        self.state.start_search()
