"""The kmock emulator (cluster.ApiServer) serves each request at a cost that does not grow with
the requests served before it: benchmarks run hundreds of runs against it, and an emulator
slowing down with its own log would pass for an operator that cannot keep up."""

from tests.operator.cluster import Cluster

REQUESTS = 300


async def test_a_reaction_sees_each_request_once_and_the_log_keeps_them_all(kmock):
    asked = []
    async with Cluster(kmock) as cluster:

        def refused(request) -> bool:
            asked.append(request)
            return request.method == "GET" and request.url.path.endswith("/refused")

        kmock[refused] << 403 << {"kind": "Status", "code": 403, "reason": "Forbidden"}
        before = len(list(kmock))
        for i in range(REQUESTS):
            await cluster.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"cm-{i}"}})
        for name in ("cm-0", "refused"):
            status, _ = await cluster.api.request("GET", cluster.url("ConfigMap", name))
            assert status == (403 if name == "refused" else 200)
        # Each request asked once (kmock walked the whole log for each: 45,000 times here).
        assert len(asked) <= REQUESTS + 2
        assert len(list(kmock)) - before == REQUESTS + 2  # what tests count requests with
