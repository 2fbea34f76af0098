"""An instant stand-in for a vLLM server's token-in/token-out routes, run as its own process so
that a benchmark's CPU clock counts the orchestrator alone.

    python benchmarks/fake_engine.py --port 8123 --stop-token-id 3 [--completion-len 16]

`POST /inference/v1/generate` answers at once with the prompt's last `completion_len` token ids
reversed plus the stop token, each with logprob -0.25 (vLLM's shape with
`--return-tokens-as-token-ids`); `GET /v1/models` and `GET /health` answer as vLLM does.
"""

import argparse

from aiohttp import web


def make_app(stop_token_id: int, completion_len: int, model: str | None, max_model_len: int = 4096) -> web.Application:
    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        max_tokens = body["sampling_params"].get("max_tokens", 1 << 30)
        ids = list(reversed(body["token_ids"][-completion_len:]))[: max_tokens - 1] + [stop_token_id]
        logprobs = [{"token": f"token_id:{t}", "logprob": -0.25} for t in ids]
        choice = {"token_ids": ids, "finish_reason": "stop", "logprobs": {"content": logprobs}}
        return web.json_response({"request_id": "fake", "choices": [choice]})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": model, "max_model_len": max_model_len}] if model else []})

    app = web.Application()
    app.router.add_post("/inference/v1/generate", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", lambda request: web.json_response({}))
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--stop-token-id", type=int, required=True)
    parser.add_argument("--completion-len", type=int, default=16)
    parser.add_argument("--model", default=None, help="the model id /v1/models lists")
    args = parser.parse_args()
    app = make_app(args.stop_token_id, args.completion_len, args.model)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)


if __name__ == "__main__":
    main()
