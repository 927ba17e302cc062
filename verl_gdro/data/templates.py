"""Prompt templates, read from the ``template`` config group (``verl_gdro/config/template``): text and
scorer in the one file a recipe selects, so the prompts and the reward cannot drift apart (the
release asked for ``\\boxed{}`` while its scorer read an "Answer:" line).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "config" / "template"
DEFAULT_TEMPLATE = "answer"
PLACEHOLDER = "{problem}"


@dataclass(frozen=True)
class PromptTemplate:
    """One prompt template: its name, its text with a ``{problem}`` slot, its scorer and reward fn."""

    name: str
    text: str
    scorer: str
    reward_function: str

    def render(self, problem: str) -> str:
        """The user message for ``problem`` (``str.replace``: the boxed template has literal braces)."""
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"problem must be a non-empty string, got {problem!r}")
        return self.text.replace(PLACEHOLDER, problem.strip())


def available_templates() -> list[str]:
    """Names of the templates shipped in the config group."""
    return sorted(p.stem for p in TEMPLATE_DIR.glob("*.yaml"))


def load_template(name: str = DEFAULT_TEMPLATE) -> PromptTemplate:
    """Load template ``name`` from its config-group file; ValueError naming ``template`` if unknown."""
    path = TEMPLATE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise ValueError(f"template={name!r} is unknown; allowed: {available_templates()}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    pt = data["prompt_template"]
    if pt["name"] != name:
        raise ValueError(f"{path}: prompt_template.name={pt['name']!r} does not match the file name {name!r}")
    if PLACEHOLDER not in pt["text"]:
        raise ValueError(f"{path}: prompt_template.text has no {PLACEHOLDER} slot")
    return PromptTemplate(
        name=pt["name"],
        text=pt["text"],
        scorer=pt["scorer"],
        reward_function=data["reward"]["custom_reward_function"]["name"],
    )
