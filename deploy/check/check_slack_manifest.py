"""The Slack app manifests of deploy/slack, checked offline.

* deploy/slack/manifest.yaml (the default) has Slack's agent messaging
  experience: `features.agent_view` with an `agent_description` of 1 to 300
  characters (Slack's limit), at most 4 suggested prompts, and no
  `assistant_view`.
* deploy/slack/manifest-assistant-view.yaml (for existing apps that keep
  the assistant pane) has `features.assistant_view` with an
  `assistant_description`, and no `agent_view`; apart from the experience,
  its description and the experience's own events it is the default
  manifest, key for key (so the two cannot drift apart).
* In each, as written and with its opt-in items (`# - x` under the bot
  scopes and bot events) turned on: the request URLs are https and end in
  the gateway's routes, every event is one Slack has and threadline
  handles, the experience's own events are only those its experience gets
  (`app_context_changed` needs `agent_view`; the `assistant_thread_*`
  events belong to `assistant_view`), and its opt-in events are exactly
  the experience's.

Run by scripts/deploy-check.sh; `--self-test` also breaks a copy in known
ways and fails unless each breakage is caught."""

import argparse
import copy
import pathlib
import sys

import yaml

HANDLED_EVENTS = {
    "app_mention", "message.channels", "message.groups", "message.im", "message.mpim",
    "app_uninstalled", "tokens_revoked",
    "app_home_opened", "app_context_changed",
    "assistant_thread_started", "assistant_thread_context_changed",
}
EXPERIENCE_EVENTS = {
    "agent_view": ["message.im", "app_home_opened", "app_context_changed"],
    "assistant_view": ["message.im", "assistant_thread_started", "assistant_thread_context_changed"],
}
DESCRIPTION = {"agent_view": "agent_description", "assistant_view": "assistant_description"}
ROUTES = ("/slack/events", "/slack/interactions")


def opted_in(text):
    """The manifest with its commented list items (`# - x`) turned on."""
    lines = []
    for line in text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith("# - "):
            indent = line[: len(line) - len(stripped)]
            item = stripped[len("# - "):].split("#")[0].strip()
            lines.append(f"{indent}- {item}")
        else:
            lines.append(line)
    return "\n".join(lines)


def optional_events(text):
    """The commented event items under bot_events, in order."""
    out, inside = [], False
    for line in text.splitlines():
        s = line.strip()
        if s == "bot_events:":
            inside = True
            continue
        if inside:
            if s.startswith("# - "):
                out.append(s[len("# - "):].split("#")[0].strip())
            elif s and not s.startswith("#") and not s.startswith("- "):
                break
    return out


def check_one(doc, experience, where):
    errors = []
    features = doc.get("features") or {}
    other = "assistant_view" if experience == "agent_view" else "agent_view"
    view = features.get(experience)
    if not isinstance(view, dict):
        return [f"{where}: features.{experience} is missing"]
    if other in features:
        errors.append(f"{where}: features.{other} beside features.{experience}")
    desc = view.get(DESCRIPTION[experience])
    if not isinstance(desc, str) or not desc.strip():
        errors.append(f"{where}: features.{experience}.{DESCRIPTION[experience]} is missing")
    elif experience == "agent_view" and len(desc) > 300:
        errors.append(f"{where}: agent_description is {len(desc)} characters (Slack: at most 300)")
    prompts = view.get("suggested_prompts", [])
    if len(prompts) > 4 or any(not (isinstance(p, dict) and p.get("title") and p.get("message")) for p in prompts):
        errors.append(f"{where}: suggested_prompts must be at most 4 of {{title, message}}")
    unknown = set(view) - {DESCRIPTION[experience], "suggested_prompts", "actions"}
    if unknown:
        errors.append(f"{where}: unknown keys in features.{experience}: {sorted(unknown)}")
    settings = doc.get("settings") or {}
    urls = [
        ((settings.get("event_subscriptions") or {}).get("request_url"), ROUTES[0]),
        ((settings.get("interactivity") or {}).get("request_url"), ROUTES[1]),
    ]
    for url, route in urls:
        if not (isinstance(url, str) and url.startswith("https://") and url.endswith(route)):
            errors.append(f"{where}: request URL {url!r} is not https://…{route}")
    events = (settings.get("event_subscriptions") or {}).get("bot_events") or []
    for e in events:
        if e not in HANDLED_EVENTS:
            errors.append(f"{where}: bot event {e!r} is not one threadline handles")
    foreign = set(EXPERIENCE_EVENTS[other]) - set(EXPERIENCE_EVENTS[experience])
    for e in sorted(foreign & set(events)):
        errors.append(f"{where}: bot event {e!r} belongs to {other}")
    scopes = ((doc.get("oauth_config") or {}).get("scopes") or {}).get("bot") or []
    if not scopes or len(set(scopes)) != len(scopes):
        errors.append(f"{where}: bot scopes empty or repeated")
    return errors


def without_experience(doc):
    d = copy.deepcopy(doc)
    for k in ("agent_view", "assistant_view"):
        (d.get("features") or {}).pop(k, None)
    ev = ((d.get("settings") or {}).get("event_subscriptions") or {})
    experience_events = set(sum(EXPERIENCE_EVENTS.values(), []))
    if "bot_events" in ev:
        ev["bot_events"] = [e for e in ev["bot_events"] if e not in experience_events]
    return d


def check(default_text, assistant_text):
    errors = []
    for text, experience, name in (
        (default_text, "agent_view", "manifest.yaml"),
        (assistant_text, "assistant_view", "manifest-assistant-view.yaml"),
    ):
        try:
            doc = yaml.safe_load(text)
            full = yaml.safe_load(opted_in(text))
        except yaml.YAMLError as e:
            errors.append(f"{name}: not YAML: {e}")
            continue
        errors += check_one(doc, experience, name)
        errors += check_one(full, experience, f"{name} (opt-in items on)")
        if optional_events(text) != EXPERIENCE_EVENTS[experience]:
            errors.append(f"{name}: opt-in events {optional_events(text)} are not {EXPERIENCE_EVENTS[experience]}")
    if not errors:
        a = without_experience(yaml.safe_load(opted_in(default_text)))
        b = without_experience(yaml.safe_load(opted_in(assistant_text)))
        if a != b:
            errors.append("manifest-assistant-view.yaml differs from manifest.yaml beyond the experience")
        da = yaml.safe_load(default_text)["features"]["agent_view"]["agent_description"]
        db = yaml.safe_load(assistant_text)["features"]["assistant_view"]["assistant_description"]
        if da != db:
            errors.append("the two experiences' descriptions differ")
    return errors


def self_test(default_text, assistant_text):
    """Breakages each check must catch."""
    def swap(text, old, new):
        assert old in text, old
        return text.replace(old, new, 1)

    cases = {
        "no agent_description": (swap(default_text, "agent_description:", "agent_descr:"), assistant_text),
        "a description over 300": (
            swap(default_text, "agent_description: ", "agent_description: " + "x" * 300), assistant_text),
        "assistant_view in the default": (
            swap(default_text, "  agent_view:\n", "  assistant_view:\n    assistant_description: x\n  agent_view:\n"),
            assistant_text),
        "a pane event in the default": (
            swap(default_text, "# - app_context_changed", "# - assistant_thread_started"), assistant_text),
        "an unknown event": (swap(default_text, "- app_mention\n", "- app_mention\n      - reaction_added\n"),
                             assistant_text),
        "an http request URL": (swap(default_text, "request_url: https://", "request_url: http://"),
                                assistant_text),
        "the second manifest drifted": (default_text, swap(assistant_text, "- chat:write", "- chat:write\n      - users:read")),
        "the second manifest's experience": (
            default_text, swap(assistant_text, "assistant_view:", "agent_view:")),
    }
    missed = [name for name, (a, b) in cases.items() if not check(a, b)]
    return missed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".")
    ap.add_argument("--self-test", action="store_true")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    root = pathlib.Path(args.root)
    default_text = (root / "deploy/slack/manifest.yaml").read_text()
    assistant_text = (root / "deploy/slack/manifest-assistant-view.yaml").read_text()
    errors = check(default_text, assistant_text)
    for e in errors:
        print(f"FAIL: {e}", file=sys.stderr)
    if errors:
        return 1
    print("slack manifests: the default has agent_view, the assistant_view one matches it")
    if args.self_test:
        missed = self_test(default_text, assistant_text)
        for m in missed:
            print(f"FAIL: self-test: not caught: {m}", file=sys.stderr)
        if missed:
            return 1
        print("slack manifests: self-test caught every breakage")
    return 0


if __name__ == "__main__":
    sys.exit(main())
