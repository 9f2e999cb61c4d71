"""``python -m hvdlike.runner ...`` is ``hvdlikerun ...``."""
from .launch import main

raise SystemExit(main())
