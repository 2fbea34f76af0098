"""A tool service with a long tail: tools that take real wall-clock time, as agentic tools do.

Agentic rollouts wait on tools (a sandbox, a web search): usually a fraction of a second,
sometimes seconds, sometimes never. This service serves rlkube's example tools over HTTP from
a separate process (`rlkube tool-service`; on a cluster, its own Deployment), and makes every
call wait a latency drawn from a seeded heavy-tailed distribution before it answers
(`latency.LatencyModel`: lognormal with a configurable median and p99/p50), with configurable
rates of calls that hang (the client's per-call timeout ends them) and calls that fail (HTTP 503).
The wait is `asyncio.sleep`: real time, no CPU, so thousands of calls wait at once.

- `latency`: the distribution and the service's config (`ToolServiceConfig`);
- `tools`: the tools it serves (pure functions of their arguments);
- `server`: the aiohttp app (`POST /v1/tools/<name>`, `GET /health`, `GET /stats`);
- `client`: what an environment calls it with: a per-call timeout, a per-env concurrency
  limit, and a record of every call's latency and outcome for the run's metrics.
"""
