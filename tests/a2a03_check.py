"""An A2A 0.3 client (`a2a-sdk` 0.3.x, JSON-RPC binding) against POST /a2a.

A2A 1.0 reads a request without `A2A-Version` as 0.3's, and 0.3 clients
send none: the agent speaks 0.3's method names and shapes beside 1.0's.
Starts the built host with an admin listener, posts a listing, then with
the 0.3 SDK: resolves the card (0.3's `url`, `preferredTransport`,
`protocolVersion` members), creates a client from it, sends a text message
(the search skill: a completed task, 0.3's `completed`, roles and `kind`
members, parsed by the SDK's pydantic models), a data part, an unknown
contract (a failed task), reads the task again with tasks/get (and its
last message only), and checks that an unknown task id and tasks/cancel
of a final task are the JSON-RPC errors -32001 and -32002. Run by .ci/run
in a virtualenv of its own (`pip install "a2a-sdk>=0.3,<0.4"`: 0.3's
`a2a` package is another than 1.x's).
"""
import asyncio
import sys
import time

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import (
    DataPart,
    Message,
    Part,
    Role,
    Task,
    TaskIdParams,
    TaskQueryParams,
    TaskState,
    TextPart,
)
from service import create_listing, running

# The host refuses an admin token shorter than 32 bytes.
TOKEN = "a2a03-check-admin-token-0123456789abcdef"


def user_message(text=None, data=None):
    part = Part(root=TextPart(text=text)) if text is not None else Part(root=DataPart(data=data))
    return Message(message_id=f"m-{time.time_ns()}", role=Role.user, parts=[part])


async def send(client, message):
    """message/send through the SDK: the one answer, a task here."""
    answers = [a async for a in client.send_message(message)]
    assert len(answers) == 1, answers
    task, update = answers[0]
    assert isinstance(task, Task) and update is None, answers[0]
    return task


def artifact_data(task):
    parts = [p.root for a in task.artifacts for p in a.parts]
    texts = [p.text for p in parts if p.kind == "text"]
    data = [p.data for p in parts if p.kind == "data"]
    assert texts and len(data) == 1, task
    return texts[0], data[0]


async def rpc_error(call):
    try:
        await call
    except A2AClientJSONRPCError as e:
        return e.error.code
    sys.exit(f"{call} did not fail")


async def check(base, admin):
    post_id = create_listing(base, admin, TOKEN, "Hand-carved walnut chess boards, made to order")
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        assert card.name == "marketplace", card
        assert card.url == base + "/a2a", card.url
        assert card.preferred_transport == "JSONRPC", card.preferred_transport
        assert card.protocol_version.startswith("0.3"), card.protocol_version
        assert {s.id for s in card.skills} == {"search", "contract_status"}, card.skills

        client = ClientFactory(ClientConfig(httpx_client=http, streaming=False)).create(card)

        # The search skill: the text is the term.
        task = await send(client, user_message("walnut chess"))
        assert task.status.state == TaskState.completed, task.status
        text, found = artifact_data(task)
        assert found["term"] == "walnut chess" and found["total"] == 1, found
        assert found["results"][0]["post_id"] == post_id, found
        assert "1 listing" in text, text
        user, agent = task.history
        assert user.role == Role.user and user.parts[0].root.text == "walnut chess", user
        assert agent.role == Role.agent and task.status.message.role == Role.agent, agent

        # tasks/get answers the same task again; historyLength 1 keeps the
        # last message.
        again = await client.get_task(TaskQueryParams(id=task.id))
        assert again == task, (again, task)
        short = await client.get_task(TaskQueryParams(id=task.id, history_length=1))
        assert [m.role for m in short.history] == [Role.agent], short.history

        # A data part {term, limit}.
        by_data = await send(client, user_message(data={"term": "chess", "limit": 5}))
        assert artifact_data(by_data)[1]["results"][0]["post_id"] == post_id

        # The contract skill: an unknown contract is a failed task.
        missing = await send(client, user_message("status of contract CTR_A2A_NONE?"))
        assert missing.status.state == TaskState.failed, missing.status
        assert "CTR_A2A_NONE" in missing.status.message.parts[0].root.text, missing.status

        # Unknown task: -32001; a final task is not cancelable: -32002.
        assert await rpc_error(client.get_task(TaskQueryParams(id="task_00000000000000000000000000"))) == -32001
        assert await rpc_error(client.cancel_task(TaskIdParams(id=task.id))) == -32002
        await client.close()
    print(f"a2a 0.3 client: card, message/send (search by text and data, contract), tasks/get, tasks/cancel ok ({task.id})")


with running(admin_token=TOKEN) as (base, admin):
    asyncio.run(check(base, admin))
