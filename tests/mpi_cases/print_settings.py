"""Prints what every rank's hvdlike read from the environment (run directly under hvdlikerun)."""
import hvdlike as hvd
from hvdlike import runtime

hvd.init()
s = runtime.state().settings
print(f"SETTINGS rank={hvd.rank()} cycle={s.cycle_time_ms} stall={s.stall_check_time} "
      f"log={s.log_level}", flush=True)
