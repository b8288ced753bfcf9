"""The official A2A client (`a2a-sdk` 1.x, JSON-RPC binding) against POST /a2a.

Starts the built host on a free port with an admin listener, mints cash
through the admin API, registers an identity and posts a listing (signed
with Ed25519), then with the SDK: resolves the agent card from
/.well-known/agent-card.json, creates a client from it, sends a message
(the search skill) and reads the completed task's results, reads the task
again with GetTask, lists the context's tasks with ListTasks (in pages, by
state, with artifacts, and a page size out of range as the SDK's
InvalidParamsError), asks for an unknown contract (a failed task), and
checks that an unknown task id is the SDK's TaskNotFoundError. Run by .ci/run after
the tests (`pip install "a2a-sdk>=1,<2"`).
"""
import asyncio
import sys
import time

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from google.protobuf.json_format import MessageToDict
from service import create_listing, running

# The host refuses an admin token shorter than 32 bytes.
TOKEN = "a2a-check-admin-token-0123456789abcdef"


def user_message(text=None, data=None):
    part = Part(text=text) if text is not None else Part()
    if data is not None:
        part.data.struct_value.update(data)
    return SendMessageRequest(message=Message(message_id=f"m-{time.time_ns()}", role=Role.ROLE_USER, parts=[part]))


async def send(client, request):
    """SendMessage through the SDK: the one answer (a task here)."""
    answers = [a async for a in client.send_message(request)]
    assert len(answers) == 1, answers
    assert answers[0].HasField("task"), answers[0]
    return answers[0].task


def artifact_data(task):
    parts = [p for a in task.artifacts for p in a.parts]
    texts = [p.text for p in parts if p.HasField("text")]
    data = [MessageToDict(p.data) for p in parts if p.HasField("data")]
    assert texts and len(data) == 1, task
    return texts[0], data[0]


async def check(base, admin):
    post_id = create_listing(base, admin, TOKEN, "Hand-carved walnut chess boards, made to order")
    async with httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        assert card.name == "marketplace", card
        # 1.0 first, then 0.3 (tests/a2a03_check.py) at the same URL; the
        # client picks 1.0.
        assert [(i.url, i.protocol_binding, i.protocol_version) for i in card.supported_interfaces] == [
            (base + "/a2a", "JSONRPC", "1.0"), (base + "/a2a", "JSONRPC", "0.3")], card.supported_interfaces
        assert card.documentation_url == base + "/docs", card.documentation_url
        assert {s.id for s in card.skills} == {"search", "contract_status"}, card.skills
        assert not card.capabilities.streaming

        client = ClientFactory(ClientConfig(httpx_client=http)).create(card)

        # The search skill: the text is the term.
        task = await send(client, user_message("walnut chess"))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED, task.status
        text, found = artifact_data(task)
        assert found["term"] == "walnut chess" and found["total"] == 1, found
        assert found["results"][0]["post_id"] == post_id, found
        assert found["results"][0]["url"] == f"{base}/api/posts/{post_id}", found
        assert "1 listing" in text, text
        assert task.history[0].role == Role.ROLE_USER and task.history[0].parts[0].text == "walnut chess"

        # GetTask answers the same task again.
        again = await client.get_task(GetTaskRequest(id=task.id))
        assert again == task, (again, task)
        short = await client.get_task(GetTaskRequest(id=task.id, history_length=1))
        assert len(short.history) == 1 and short.history[0].role == Role.ROLE_AGENT, short.history

        # A data part {term, limit} works the same way.
        by_data = await send(client, user_message(data={"term": "chess", "limit": 5}))
        assert artifact_data(by_data)[1]["results"][0]["post_id"] == post_id

        # The contract skill: an unknown contract is a failed task.
        missing = await send(client, user_message("what is the status of contract CTR_A2A_NONE?"))
        assert missing.status.state == TaskState.TASK_STATE_FAILED, missing.status
        assert "CTR_A2A_NONE" in missing.status.message.parts[0].text, missing.status

        # ListTasks: the tasks of a context, newest first, in pages. The
        # first message made the context; a second names it.
        follow = user_message(data={"term": "walnut"})
        follow.message.context_id = task.context_id
        second = await send(client, follow)
        assert second.context_id == task.context_id, second
        listed = await client.list_tasks(ListTasksRequest(context_id=task.context_id))
        assert [t.id for t in listed.tasks] == [second.id, task.id], listed
        assert listed.total_size == 2 and listed.next_page_token == "", listed
        assert not listed.tasks[0].artifacts, listed.tasks[0]
        page = await client.list_tasks(ListTasksRequest(context_id=task.context_id, page_size=1))
        assert [t.id for t in page.tasks] == [second.id] and page.next_page_token, page
        rest = await client.list_tasks(
            ListTasksRequest(context_id=task.context_id, page_size=1, page_token=page.next_page_token)
        )
        assert [t.id for t in rest.tasks] == [task.id] and rest.next_page_token == "", rest
        with_artifacts = await client.list_tasks(
            ListTasksRequest(context_id=task.context_id, include_artifacts=True, status=TaskState.TASK_STATE_COMPLETED)
        )
        assert with_artifacts.tasks[1].artifacts == task.artifacts, with_artifacts
        try:
            await client.list_tasks(ListTasksRequest(context_id=task.context_id, page_size=101))
        except InvalidParamsError:
            pass
        else:
            sys.exit("ListTasks with pageSize 101 did not raise InvalidParamsError")

        # An unknown task id is the SDK's TaskNotFoundError (-32001).
        try:
            await client.get_task(GetTaskRequest(id="task_00000000000000000000000000"))
        except TaskNotFoundError:
            pass
        else:
            sys.exit("GetTask of an unknown id did not raise TaskNotFoundError")
        await client.close()
    print(f"a2a client: card, SendMessage (search by text and data, contract), GetTask, ListTasks ok ({task.id})")


with running(admin_token=TOKEN) as (base, admin):
    asyncio.run(check(base, admin))
