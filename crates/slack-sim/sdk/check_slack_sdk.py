"""slack-sim checked by Slack's own Python SDK (slack_sdk), a client nobody
here wrote: its WebClient reads slack-sim's answers, its chat_stream helper
streams a reply through chat.startStream / appendStream / stopStream the way
it does against Slack, its conversations_history (and its cursor paging)
reads the channel, and its SignatureVerifier accepts slack-sim's Events API
deliveries and a button click's block_actions form (and refuses it
tampered), its ContextActionsBlock / FeedbackButtonsElement (feedback
buttons on an answer, sent with a stream's stop and a post, read back and
clicked), its WebhookClient answers the click through the payload's
response_url, and its Socket Mode client connects through apps.connections.open,
receives an events_api envelope and acknowledges it. Bolt for Python
(slack_bolt) parses the agent messaging experience's app_home_opened and
app_context_changed deliveries into events for its listeners. Run by scripts/sdk-check.sh against a running slack-sim:

    python check_slack_sdk.py http://127.0.0.1:PORT

Exits non-zero with the failed check's message."""

import http.server
import json
import sys
import threading
import time
import urllib.parse
import urllib.request

import slack_sdk
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError
from slack_sdk.models.blocks import (
    Block,
    ContextActionsBlock,
    FeedbackButtonObject,
    FeedbackButtonsElement,
)
from slack_sdk.models.blocks.block_elements import UrlSourceElement
from slack_sdk.models.messages.chunk import MarkdownTextChunk, PlanUpdateChunk, TaskUpdateChunk
from slack_sdk.signature import SignatureVerifier
from slack_sdk.socket_mode import SocketModeClient
from slack_sdk.socket_mode.request import SocketModeRequest
from slack_sdk.socket_mode.response import SocketModeResponse
from slack_sdk.webhook import WebhookClient

BASE = sys.argv[1].rstrip("/")
checks = []


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    checks.append(what)


def ctl(path, body):
    req = urllib.request.Request(
        f"{BASE}/_sim/{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def get(path):
    with urllib.request.urlopen(f"{BASE}/_sim/{path}", timeout=10) as r:
        return json.loads(r.read())


# An app endpoint that verifies every delivery and interaction with the
# SDK's verifier.
deliveries = []
raws = []
interactions = []
secret_box = {}


class Receiver(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.path == "/slack/interactivity":
            verifier = SignatureVerifier(secret_box["secret"])
            headers = dict(self.headers.items())
            interactions.append({
                "valid": verifier.is_valid_request(body, headers),
                "tampered_valid": verifier.is_valid_request(body + b"&x=1", headers),
                "content_type": self.headers.get("content-type", ""),
                "form": urllib.parse.parse_qs(body.decode(), keep_blank_values=True),
            })
            self.send_response(200)
            self.end_headers()
            return
        ok = SignatureVerifier(secret_box["secret"]).is_valid(
            body=body.decode(),
            timestamp=self.headers.get("x-slack-request-timestamp", ""),
            signature=self.headers.get("x-slack-signature", ""),
        )
        deliveries.append((ok, json.loads(body)))
        raws.append({"body": body.decode(), "headers": {k.lower(): [v] for k, v in self.headers.items()}})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
threading.Thread(target=server.serve_forever, daemon=True).start()
url = f"http://127.0.0.1:{server.server_address[1]}/slack/events"
interactivity_url = f"http://127.0.0.1:{server.server_address[1]}/slack/interactivity"

team = ctl("teams", {"name": "SDK"})["id"]
user = ctl("users", {"team_id": team, "name": "ana"})["id"]
channel = ctl("channels", {"team_id": team, "name": "sdk", "kind": "public", "members": [user]})["id"]
app = ctl("apps", {"name": "SDK check", "request_urls": [url], "events": ["message.channels"]})
secret_box["secret"] = app["signing_secret"]
install = ctl(
    f"apps/{app['id']}/installs",
    {"team_id": team, "scopes": ["chat:write", "channels:history"], "join_channels": [channel]},
)
ctl("settings", {"posts_per_second": 100.0, "post_burst": 100.0})
client = WebClient(token=install["bot_token"], base_url=f"{BASE}/api/")

auth = client.auth_test()
check(auth["bot_id"] == install["bot_id"], "auth.test names the bot")

root = ctl("act/post", {"user": user, "channel": channel, "text": "a question"})["ts"]

# 1. The helper, short reply: an empty start, then one stop with the text.
stream = client.chat_stream(
    channel=channel, thread_ts=root, recipient_team_id=team, recipient_user_id=user
)
stream.append(markdown_text="Short ")
stream.append(markdown_text="answer.")
stopped = stream.stop()
check(stopped["ok"] and stopped["message"]["text"] == "Short answer.", "chat_stream: a short reply is one start and one stop")
check(stopped["message"]["streaming_state"] == "completed", "chat_stream: the stopped message is completed")
short_ts = stream.ts

# 2. The helper, buffered past its size: start with content, appends, stop
#    with blocks and metadata.
stream = client.chat_stream(
    channel=channel, thread_ts=root, recipient_team_id=team, recipient_user_id=user, buffer_size=8
)
pieces = ["The thread ", "asks about ", "streaming; ", "here is ", "a longer answer."]
for p in pieces:
    stream.append(markdown_text=p)
meta = {"event_type": "threadline_reply", "event_payload": {"intent_id": "sdk-1"}}
label = [{"type": "context", "elements": [{"type": "mrkdwn", "text": "AI-generated"}]}]
stopped = stream.stop(blocks=label, metadata=meta)
long_ts = stream.ts
check(stopped["message"]["text"] == "".join(pieces), "chat_stream: appends and the stop add up to the text sent")
calls = [c for c in get(f"calls?channel={channel}")["calls"] if c.get("ts") == long_ts]
methods = [c["method"] for c in calls]
check(
    methods[0] == "chat.startStream" and methods[-1] == "chat.stopStream"
    and methods.count("chat.appendStream") >= 1 and all(c["outcome"] == "ok" for c in calls),
    f"chat_stream: start, appends, stop, all ok ({methods})",
)

# 3. Reading back: replies show both streamed messages, final, with metadata.
replies = client.conversations_replies(channel=channel, ts=root, include_all_metadata=True)
by_ts = {m["ts"]: m for m in replies["messages"]}
check(by_ts[short_ts]["text"] == "Short answer.", "conversations.replies shows the short stream's text")
check(by_ts[long_ts]["metadata"] == meta, "conversations.replies shows the stop's metadata")
check(by_ts[long_ts]["streaming_state"] == "completed", "conversations.replies shows streaming_state")

# 3b. Thinking steps: task and plan chunks through the helper, read back as
#     task cards and a plan block; a chunk Slack refuses is invalid_chunks.
stream = client.chat_stream(
    channel=channel, thread_ts=root, recipient_team_id=team, recipient_user_id=user
)
stream.append(chunks=[
    TaskUpdateChunk(id="read", title="Reading the thread", status="complete"),
    TaskUpdateChunk(id="write", title="Writing the answer", status="in_progress"),
])
stream.append(chunks=[MarkdownTextChunk(text="Thought through.")])
stopped = stream.stop(chunks=[
    TaskUpdateChunk(
        id="write", title="Writing the answer", status="complete",
        details="All written.",
        sources=[UrlSourceElement(url="https://example.com/runbook", text="Runbook")],
    ),
])
tasks_ts = stream.ts
replies = client.conversations_replies(channel=channel, ts=root)
shown = next(m for m in replies["messages"] if m["ts"] == tasks_ts)
cards = [b for b in shown.get("blocks", []) if b["type"] == "task_card"]
check(
    [(c["task_id"], c["status"]) for c in cards] == [("read", "complete"), ("write", "complete")],
    "chat_stream with TaskUpdateChunk: the tasks read back by id, latest status winning",
)
check(
    cards[1]["sources"] == [{"type": "url", "url": "https://example.com/runbook", "text": "Runbook"}]
    and cards[1]["details"]["type"] == "rich_text",
    "a task card shows its details as rich_text and its URL sources",
)
check(shown["text"] == "Thought through.", "the task chunks leave the text as streamed")
stream = client.chat_stream(
    channel=channel, thread_ts=root, recipient_team_id=team, recipient_user_id=user,
    task_display_mode="plan",
)
stream.append(chunks=[PlanUpdateChunk(title="Looking into it"),
                      TaskUpdateChunk(id="a", title="Read", status="in_progress")])
stopped = stream.stop(chunks=[TaskUpdateChunk(id="a", title="Read", status="complete")])
plan = [b for b in stopped["message"]["blocks"] if b["type"] == "plan"]
check(
    len(plan) == 1 and plan[0]["title"] == "Looking into it"
    and [(t["task_id"], t["status"]) for t in plan[0]["tasks"]] == [("a", "complete")],
    "task_display_mode=plan with PlanUpdateChunk: one plan block holding its tasks",
)
started = client.chat_startStream(
    channel=channel, thread_ts=root, recipient_team_id=team, recipient_user_id=user,
    chunks=[TaskUpdateChunk(id="x", title="Step", status="pending")],
)
for bad in (
    [{"type": "task_update", "id": "x", "title": "Step", "status": "finished"}],
    [{"type": "markdown_text", "text": "x", "sources": [{"type": "url", "url": "https://e.com", "text": "e"}]}],
    [{"type": "thinking", "text": "x"}],
):
    try:
        client.chat_appendStream(channel=channel, ts=started["ts"], chunks=bad)
        check(False, f"{bad} is refused")
    except SlackApiError as e:
        check(e.response["error"] == "invalid_chunks", f"invalid_chunks for {bad[0]['type']}")
client.chat_stopStream(channel=channel, ts=started["ts"])

# 4. The raw methods and their errors, as SlackApiError.
started = client.chat_startStream(
    channel=channel, thread_ts=root, recipient_team_id=team, recipient_user_id=user,
    markdown_text="Raw",
)
client.chat_appendStream(channel=channel, ts=started["ts"], markdown_text=" start")
try:
    client.chat_appendStream(channel=channel, ts=started["ts"], chunks=[{"type": "markdown_text", "text": "x"}])
    check(False, "a chunk appended to a markdown_text stream is refused")
except SlackApiError as e:
    check(e.response["error"] == "streaming_mode_mismatch", "streaming_mode_mismatch as SlackApiError")
client.chat_stopStream(channel=channel, ts=started["ts"])
try:
    client.chat_appendStream(channel=channel, ts=started["ts"], markdown_text="late")
    check(False, "an append after the stop is refused")
except SlackApiError as e:
    check(e.response["error"] == "message_not_in_streaming_state", "message_not_in_streaming_state after the stop")
try:
    client.chat_startStream(channel=channel, thread_ts=root, markdown_text="no recipient")
    check(False, "a channel stream without its recipient is refused")
except SlackApiError as e:
    check(e.response["error"] == "missing_recipient_user_id", "missing_recipient_user_id in a channel")

# 5. Every delivery (the question, six opening events, six
#    message_changed) passed the SDK's signature verifier.
deadline = time.time() + 10
while len(deliveries) < 13 and time.time() < deadline:
    time.sleep(0.05)
check(len(deliveries) >= 13, f"thirteen deliveries arrived ({len(deliveries)})")
check(all(ok for ok, _ in deliveries), "SignatureVerifier accepts every delivery")
kinds = [(d["event"].get("subtype"), d["event"].get("streaming_state")) for _, d in deliveries]
check(kinds.count((None, "in_progress")) == 6, f"six opening events ({kinds})")
check(kinds.count(("message_changed", None)) == 6, f"six message_changed at the stops ({kinds})")

# 6. conversations.history: a post with a button and metadata reads back,
#    metadata only when asked; thread replies stay out; the SDK's own
#    cursor paging walks the same messages.
approve = {"type": "button", "action_id": "approve", "style": "primary",
           "text": {"type": "plain_text", "text": "Approve"}, "value": "yes"}
blocks = [{"type": "section", "block_id": "ask",
           "text": {"type": "mrkdwn", "text": "Ship it?"}, "accessory": approve}]
meta2 = {"event_type": "threadline_review", "event_payload": {"decision_id": "sdk-2"}}
posted = client.chat_postMessage(channel=channel, text="Ship it?", blocks=blocks, metadata=meta2)
button_ts = posted["ts"]
history = client.conversations_history(channel=channel, include_all_metadata=True)
check(history["messages"][0]["ts"] == button_ts, "conversations_history: newest first")
check(history["messages"][0]["metadata"] == meta2, "conversations_history: the post's metadata with include_all_metadata")
check(history["messages"][0]["blocks"] == blocks, "conversations_history: the post's blocks")
tss = [m["ts"] for m in history["messages"]]
check(root in tss and short_ts not in tss and long_ts not in tss, "conversations_history: the root, not its replies")
plain = client.conversations_history(channel=channel)
check("metadata" not in plain["messages"][0], "conversations_history: no metadata unless asked")
pages = [[m["ts"] for m in page["messages"]] for page in client.conversations_history(channel=channel, limit=1)]
check(sum(pages, []) == tss, f"conversations_history: the SDK's cursor paging walks every message once ({len(pages)} pages)")

# 7. A click on the button: one block_actions form at the interactivity URL,
#    which the SDK's verifier accepts, and refuses tampered.
set_url = ctl(f"apps/{app['id']}/interactivity", {"url": interactivity_url})
check(set_url == {"ok": True, "url": interactivity_url}, "the interactivity request URL is set")
entry = ctl("act/click", {"user": user, "channel": channel, "ts": button_ts, "action_id": "approve"})
check(entry["status"] == 200 and entry["value"] == "yes", f"the click reached the app ({entry})")
check(len(interactions) == 1, f"one interaction arrived ({len(interactions)})")
got = interactions[0]
check(got["content_type"] == "application/x-www-form-urlencoded", "the interaction is a form")
check(got["valid"], "SignatureVerifier.is_valid_request accepts the interaction")
check(not got["tampered_valid"], "SignatureVerifier.is_valid_request refuses it tampered")
check(list(got["form"]) == ["payload"] and len(got["form"]["payload"]) == 1, "the form has one field, payload")
payload = json.loads(got["form"]["payload"][0])
check(payload["type"] == "block_actions", "the payload is block_actions")
action = payload["actions"][0]
check((action["action_id"], action["value"], action["block_id"]) == ("approve", "yes", "ask"),
      "the payload's action is the button clicked")
check(payload["container"]["message_ts"] == button_ts and payload["user"]["id"] == user
      and payload["api_app_id"] == app["id"], "the payload names the message, the person and the app")
check("metadata" not in payload["message"], "the payload's message leaves the metadata out")
check(get("interactions")["interactions"] == [entry], "the interaction log holds the click")

# 7b. The payload's response_url, through the SDK's WebhookClient: an
#     ephemeral answer for the person who clicked, logged, out of the
#     history; a replacement of the message; the sixth use refused.
response_url = payload["response_url"]
hook = WebhookClient(response_url)
sent = hook.send(text="Only you see this", response_type="ephemeral")
check(sent.status_code == 200 and json.loads(sent.body) == {"ok": True},
      f"WebhookClient.send to the response_url: 200 ok ({sent.status_code} {sent.body})")
url_id = response_url.rstrip("/").split("/")[-2]
uses = get(f"responses?url_id={url_id}")["responses"]
check(len(uses) == 1 and uses[0]["result"] == "ok" and uses[0]["response_type"] == "ephemeral"
      and uses[0]["user"] == user and uses[0]["channel"] == channel
      and uses[0]["message_ts"] == button_ts and uses[0]["text"] == "Only you see this",
      f"the response log holds the ephemeral answer ({uses})")
eph = get(f"ephemerals?channel={channel}")["ephemerals"]
check([(e["user"], e["text"]) for e in eph] == [(user, "Only you see this")],
      "the ephemeral shows to the person who clicked only")
check(button_ts in [m["ts"] for m in client.conversations_history(channel=channel)["messages"]]
      and all(m.get("text") != "Only you see this" for m in client.conversations_history(channel=channel)["messages"]),
      "the ephemeral is not in conversations_history")
sent = hook.send(text="Shipped", replace_original=True)
check(sent.status_code == 200, f"WebhookClient.send(replace_original=True): 200 ({sent.status_code})")
now = client.conversations_history(channel=channel, latest=button_ts, inclusive=True, limit=1)["messages"][0]
check(now["ts"] == button_ts and now["text"] == "Shipped" and "edited" in now,
      "replace_original replaces the message in place")
for i in range(3):
    hook.send(text=f"again {i}")
sent = hook.send(text="one too many")
check(sent.status_code == 404 and json.loads(sent.body) == {"ok": False, "error": "used_url"},
      f"the sixth use is refused with used_url ({sent.status_code} {sent.body})")

# 7c. Feedback buttons, as AI apps attach them to an answer: a
#     context_actions block with feedback_buttons built with the SDK's own
#     classes, sent with a stream's stop and with a post, read back as the
#     SDK parses it; a malformed one refused; a click on either button is a
#     signed block_actions payload whose action is the element's, with the
#     pressed button's value.
def feedback_block(decision):
    return ContextActionsBlock(
        block_id=f"feedback_{decision}",
        elements=[
            FeedbackButtonsElement(
                action_id="feedback",
                positive_button=FeedbackButtonObject(
                    text="👍", accessibility_label="This answer was helpful", value=f"positive:{decision}"
                ),
                negative_button=FeedbackButtonObject(
                    text="👎", accessibility_label="This answer was not helpful", value=f"negative:{decision}"
                ),
            )
        ],
    )


fb = feedback_block("d1")
fb.validate_json()
stream = client.chat_stream(
    channel=channel, thread_ts=root, recipient_team_id=team, recipient_user_id=user
)
stream.append(markdown_text="An answer worth rating.")
stream.stop(blocks=[label[0], fb])
rated_ts = stream.ts
rated = {m["ts"]: m for m in client.conversations_replies(channel=channel, ts=root)["messages"]}[rated_ts]
parsed = [Block.parse(b) for b in rated["blocks"]]
kinds = [type(b).__name__ for b in parsed]
check(kinds[-1] == "ContextActionsBlock" and "ContextBlock" in kinds,
      f"the stop's feedback block reads back below the text and the label ({kinds})")
check(isinstance(parsed[-1].elements[0], FeedbackButtonsElement)
      and parsed[-1].to_dict() == fb.to_dict(),
      "the SDK parses the feedback block back as it was sent (FeedbackButtonsElement)")
posted_fb = client.chat_postMessage(channel=channel, thread_ts=root, text="A posted answer",
                                    blocks=[label[0], feedback_block("d2")])
check(Block.parse(posted_fb["message"]["blocks"][-1]).to_dict() == feedback_block("d2").to_dict(),
      "chat.postMessage takes the feedback block")
broken = feedback_block("d3").to_dict()
del broken["elements"][0]["negative_button"]
try:
    client.chat_postMessage(channel=channel, text="x", blocks=[broken])
    check(False, "feedback buttons without a negative button are refused")
except SlackApiError as e:
    check(e.response["error"] == "invalid_blocks", "a malformed context_actions block: invalid_blocks")
before = len(interactions)
for side in ["positive", "negative"]:
    entry = ctl("act/click", {"user": user, "channel": channel, "ts": rated_ts, "action_id": "feedback",
                              "button": side})
    check(entry["status"] == 200 and entry["value"] == f"{side}:d1", f"the {side} click reached the app ({entry})")
check(len(interactions) == before + 2, f"two feedback interactions arrived ({len(interactions) - before})")
for got, side in zip(interactions[before:], ["positive", "negative"]):
    check(got["valid"] and not got["tampered_valid"], "SignatureVerifier accepts a feedback click, refuses it tampered")
    payload = json.loads(got["form"]["payload"][0])
    action = payload["actions"][0]
    check(payload["type"] == "block_actions" and action["type"] == "feedback_buttons"
          and action["action_id"] == "feedback" and action["block_id"] == "feedback_d1"
          and action["value"] == f"{side}:d1" and action["text"]["type"] == "plain_text"
          and "action_ts" in action,
          f"the {side} click's action is the element's, with the pressed button's value ({action})")
    check(payload["container"]["message_ts"] == rated_ts, "the feedback click names the answer")

# 8. Socket Mode: the SDK's own client (the builtin one) opens a connection
#    with the app-level token through apps.connections.open, gets a
#    person's message as an events_api envelope and acknowledges it;
#    slack-sim records the ack and does not retry.
ctl("settings", {"delivery_deadline_ms": 500, "time_scale": 0.01})
sock_app = ctl("apps", {"name": "SDK socket", "socket_mode": True, "events": ["message.channels"]})
ctl(f"apps/{sock_app['id']}/installs", {"team_id": team, "scopes": ["chat:write"], "join_channels": [channel]})
envelopes = []


def on_request(client: SocketModeClient, req: SocketModeRequest):
    envelopes.append(req)
    client.send_socket_mode_response(SocketModeResponse(envelope_id=req.envelope_id))


sock = SocketModeClient(app_token=sock_app["app_token"], web_client=WebClient(base_url=f"{BASE}/api/"))
sock.socket_mode_request_listeners.append(on_request)
try:
    sock.connect()
    deadline = time.time() + 10
    while not sock.is_connected() and time.time() < deadline:
        time.sleep(0.05)
    check(sock.is_connected(), "SocketModeClient connects through apps.connections.open")
    conns = get(f"socket?app_id={sock_app['id']}")["connections"]
    check(len(conns) == 1, f"slack-sim holds the SDK's connection ({conns})")
    said = ctl("act/post", {"user": user, "channel": channel, "text": "over the socket"})["ts"]
    deadline = time.time() + 10
    while not envelopes and time.time() < deadline:
        time.sleep(0.05)
    check(len(envelopes) == 1, f"one envelope reached the SDK ({len(envelopes)})")
    req = envelopes[0]
    check(req.type == "events_api" and req.retry_attempt == 0, f"an events_api envelope, first attempt ({req.type}, {req.retry_attempt})")
    check(req.payload["type"] == "event_callback" and req.payload["event"]["ts"] == said
          and req.payload["api_app_id"] == sock_app["id"], "its payload is the message's event_callback")
    deadline = time.time() + 10
    acked = []
    while not acked and time.time() < deadline:
        acked = [d for d in get(f"deliveries?app_id={sock_app['id']}")["deliveries"] if d["result"] == "acked"]
        time.sleep(0.05)
    check(len(acked) == 1 and acked[0]["envelope_id"] == req.envelope_id, "slack-sim records the SDK's ack")
    time.sleep(1.5)
    tries = get(f"deliveries?app_id={sock_app['id']}")["deliveries"]
    check(len(tries) == 1 and len(envelopes) == 1, f"an acked envelope is not retried ({len(tries)} attempts)")
    acks = [r for r in get(f"socket?app_id={sock_app['id']}")["log"] if r["kind"] == "ack"]
    check(len(acks) == 1 and acks[0]["matched"], "the socket log holds the ack")
finally:
    sock.close()

# 9. The agent messaging experience: an agent_view app hears
#    app_home_opened (tab messages) and app_context_changed with Slack's
#    entities, signed as the SDK verifies; Bolt for Python (slack_bolt)
#    parses each delivery into an event for its listener, naming the person
#    and the DM as its context; the SDK's setSuggestedPrompts without a
#    thread sets the prompts at the top of the Messages tab.
agent_app = ctl("apps", {"name": "SDK agent", "request_urls": [url], "experience": "agent_view",
                         "events": ["message.im", "app_home_opened", "app_context_changed"]})
agent_install = ctl(f"apps/{agent_app['id']}/installs",
                    {"team_id": team, "scopes": ["chat:write", "im:history", "assistant:write"]})
secret_box["secret"] = agent_app["signing_secret"]
before = len(deliveries)
canvas = {"type": "slack#/types/canvas_id", "value": "F0CANVAS01"}
listed = {"type": "slack#/types/list_id", "value": "F0LIST0001"}
said = {"type": "slack#/types/message_context", "value": {"message_ts": root, "channel_id": channel}}
dm = ctl("act/agent_open", {"user": user, "app_id": agent_app["id"], "channel": channel})["channel"]
ctl("act/agent_context", {"user": user, "app_id": agent_app["id"], "entities": [canvas, said, listed]})
ctl("act/agent_context", {"user": user, "app_id": agent_app["id"], "entities": []})
deadline = time.time() + 10
while len(deliveries) < before + 3 and time.time() < deadline:
    time.sleep(0.05)
got = deliveries[before:]
check(len(got) == 3 and all(ok for ok, _ in got), f"three agent events, each verified ({len(got)})")
# (each event is delivered on its own: they may arrive in any order)
events_got = [d["event"] for _, d in got]
opened = next((e for e in events_got if e["type"] == "app_home_opened"), {})
changed = next((e for e in events_got if e["type"] == "app_context_changed" and e.get("context")), {})
cleared = next((e for e in events_got if e["type"] == "app_context_changed" and e.get("context") == {}), {})
check(opened["type"] == "app_home_opened" and opened["tab"] == "messages" and opened["channel"] == dm
      and opened["user"] == user and opened["context"]["entities"][0]["value"] == channel
      and opened["context"]["entities"][0]["team_id"] == team,
      f"app_home_opened on the Messages tab, with the context ({opened})")
check(changed["type"] == "app_context_changed" and [e["type"] for e in changed["context"]["entities"]]
      == ["slack#/types/canvas_id", "slack#/types/message_context", "slack#/types/list_id"]
      and changed["context"]["entities"][1]["value"] == {"message_ts": root, "channel_id": channel},
      f"app_context_changed with the entities in order ({changed})")
check(cleared.get("context") == {}, f"an empty context is {{}} ({events_got})")

from slack_bolt import App as BoltApp
from slack_bolt.request import BoltRequest

bolt = BoltApp(signing_secret=agent_app["signing_secret"], token=agent_install["bot_token"],
               token_verification_enabled=False,
               client=WebClient(token=agent_install["bot_token"], base_url=f"{BASE}/api/"))
heard = []


@bolt.event("app_home_opened")
def on_opened(event, context):
    heard.append(("opened", event.get("tab"), context.user_id, context.channel_id, context.team_id))


@bolt.event("app_context_changed")
def on_changed(event, context):
    entities = (event.get("context") or {}).get("entities") or []
    heard.append(("changed", [e["type"] for e in entities], context.user_id, context.channel_id,
                  context.team_id))


for (_, body), raw in zip(got, raws[before:]):
    resp = bolt.dispatch(BoltRequest(body=raw["body"], headers=raw["headers"]))
    check(resp.status == 200, f"Bolt accepts the {body['event']['type']} delivery ({resp.status} {resp.body})")
deadline = time.time() + 10
while len(heard) < 3 and time.time() < deadline:
    time.sleep(0.05)
# (in the order the deliveries arrived, which is any)
check(("opened", "messages", user, dm, team) in heard,
      f"Bolt's app_home_opened listener gets the Messages tab, the person and the DM ({heard})")
check(("changed", ["slack#/types/canvas_id", "slack#/types/message_context",
                   "slack#/types/list_id"], user, dm, team) in heard,
      f"Bolt's app_context_changed listener gets the entities, the person and the DM ({heard})")
check(any(h[:2] == ("changed", []) for h in heard), f"Bolt's listener gets the empty context ({heard})")

agent_client = WebClient(token=agent_install["bot_token"], base_url=f"{BASE}/api/")
prompts = [{"title": "Explain an error", "message": "Explain this error: "}]
set_prompts = agent_client.assistant_threads_setSuggestedPrompts(channel_id=dm, title="How can I help?",
                                                                 prompts=prompts)
check(set_prompts["ok"], "setSuggestedPrompts without a thread answers ok")
tab = get(f"agent_tabs?channel={dm}")["tabs"][0]
check(tab["suggested_prompts"] == prompts and tab["prompts_title"] == "How can I help?",
      f"the prompts show at the top of the Messages tab ({tab})")

server.shutdown()
print(f"slack_sdk {slack_sdk.version.__version__}, slack_bolt: {len(checks)} checks passed")
for c in checks:
    print(f"  ok  {c}")
