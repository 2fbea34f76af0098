"""`rlkube pool-trainer`'s process: the base model, rank 0's roster and Attach service, the loop."""

import logging
import signal

from rlkube import auth
from rlkube.config.pool import PoolTrainerConfig
from rlkube.scopes import ROLLOUTS, member_scoped
from rlkube.trainer.pool.loop import PoolLoop
from rlkube.trainer.pool.roster import Roster
from rlkube.trainer.rl.multi_run import MultiRunTrainer

logger = logging.getLogger(__name__)

STATUS_FILE = "pool_status.json"
"""Under `output_dir`: rank 0's members, steps, trained tokens, shares, who finished or failed."""


def member_credential(member: str) -> str | None:
    """The rollouts credential of member `member`'s orchestrator under the pool's token
    (`RLKUBE_TOKEN`); None without one (its orchestrator then serves open too)."""
    token = auth.run_token()
    return member_scoped(token, member, ROLLOUTS) if token else None


def run(config: PoolTrainerConfig) -> None:
    """Train members as they attach, until SIGTERM (or SIGINT)."""
    from rlkube.transport.pool import start_pool_server

    pool = MultiRunTrainer.build(config.base_trainer_config())
    roster = server = None
    if pool.info.rank == 0:
        roster = Roster(config, pool.misfit, member_credential)
        server = start_pool_server(roster, config.pool.host, config.pool.port, auth.run_token())
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: roster.stop())
    loop = PoolLoop(pool, roster, member_credential, config.pool.fetch_unavailable_s, config.output_dir / STATUS_FILE)
    try:
        loop.run()
    finally:
        try:
            if server is not None:
                server.stop(grace=2)
            loop.close()
            if roster is not None:
                roster.close()
        finally:
            pool.close()
