"""A pool whose replicas change while it runs (`client.base_urls_file`, what `kubectl scale
rlrun` changes through the operator's ConfigMap): fake engines over real HTTP, real verifiers
rollouts. A new replica gets no request before it serves the current policy; one no longer
listed gets no new request, and a rollout in flight on it that fails as its server stops (vLLM
answers what it holds with a 500 on SIGTERM) comes back lost and is re-issued on the others,
so its group is whole, once."""

import asyncio

from rlkube.config import EnvConfig
from rlkube.envs import load_env
from rlkube.orchestrator.rollouts import EnvRunner, Reissuer, replica_lost, run_group

from tests.orchestrator.test_inference_pool import make_pool, replicas, until

POLICY = (1, "/w/step_1")


def on_replica(pool, runner, url: str):
    """A task the pool routes to `url`."""
    return next((e, t) for e, t in (runner.next_task() for _ in range(40)) if pool.replica_for(runner.name, e) == url)


def test_replicas_join_on_the_policy_and_leave_draining(tiny_model, tmp_path):
    env_config = EnvConfig(args={"num_examples": 20})
    runner = EnvRunner(env_config, load_env(env_config), seed=0)
    listing = tmp_path / "inference_urls"
    with replicas(tiny_model, 2) as servers:
        fakes, urls = [s.fake for s in servers], [s.url for s in servers]
        listing.write_text(urls[0] + "\n")

        async def go():
            pool = make_pool(tiny_model, ["http://ignored-while-the-file-lists-some:1"], base_urls_file=str(listing),
                             resync_interval_s=60)
            assert pool.base_urls == urls[:1]
            async with runner.serving():
                await pool.sync((0, None), 60, fresh=True)
                await pool.load_policy(*POLICY, 60)
                # Scale up: replica 1 (started paused, on the base weights) is listed. It is
                # routed to only after `sync` has loaded the policy into it.
                listing.write_text("\n".join(urls) + "\n")
                assert pool.base_urls == urls[:1] and fakes[1].generate_requests == 0
                assert await pool.sync(POLICY, 60) == [urls[1]]
                assert pool.base_urls == urls and fakes[1].weight_version == "1"
                example_id, task = on_replica(pool, runner, urls[1])
                (rollout,) = await run_group(runner, pool, example_id, task, 1, 1.0, lambda: 1)
                assert rollout.error is None and rollout.served_versions == ["1"]
                assert pool.metrics()["rollouts/on_joined_replicas"] == 1

                # Scale down while a group is in flight on replica 1: it leaves the routing at
                # once; when its server goes, the group's rollouts are re-issued on replica 0.
                servers[1].call(setattr, fakes[1], "hang", True)
                example_id, task = on_replica(pool, runner, urls[1])
                reissuer = Reissuer(lambda r, e, t, n: run_group(r, pool, e, t, n, 1.0, lambda: 1), 0.1)
                group = asyncio.ensure_future(reissuer(runner, example_id, task, 3))
                await until(lambda: fakes[1].generate_requests == 4)
                listing.write_text(urls[0] + "\n")
                await pool.sync(POLICY, 60)
                assert pool.base_urls == urls[:1] and pool.draining == {urls[1]}
                assert pool.replica_for(runner.name, example_id) == urls[0], "no new request to a leaving replica"
                servers[1].call(fakes[1].shut_down.set)  # its pod is deleted: the engine fails what it holds
                done = await group
                await pool.sync(POLICY, 60)
                assert pool.draining == set() and pool.metrics()["inference/replicas"] == 1
                return done, reissuer.reissued

        group, reissued = asyncio.run(go())
    assert len(group) == 3 and reissued == 3, (reissued, [r.error for r in group])
    assert all(r.error is None and not replica_lost(r) and r.served_versions == ["1"] for r in group)
    assert fakes[1].generated_versions == ["1"], "replica 1 generated only its one rollout, on the policy"


def test_an_env_workers_pool_takes_a_new_replica_once_the_orchestrator_resumed_it(tiny_model, tmp_path):
    """An env worker does not drive the weights: a listed replica joins its routing once it
    answers unpaused on a policy version (only the orchestrator's `sync` resumes a new one)."""
    listing = tmp_path / "inference_urls"
    with replicas(tiny_model, 2) as servers:
        urls = [s.url for s in servers]
        listing.write_text("\n".join(urls))

        async def go():
            pool = make_pool(tiny_model, urls[:1], base_urls_file=str(listing), resync_interval_s=0.05)
            pool.base_urls = urls[:1]  # as it was before the listing grew
            watcher = asyncio.ensure_future(pool.watch_reachable())
            try:
                await asyncio.sleep(0.3)
                assert pool.base_urls == urls[:1], "paused on the base weights: not yet"
                servers[1].call(setattr, servers[1].fake, "weight_version", "1")
                servers[1].call(servers[1].fake.resumed.set)
                await until(lambda: pool.base_urls == urls)
            finally:
                watcher.cancel()

        asyncio.run(go())
