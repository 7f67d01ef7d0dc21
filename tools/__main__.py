"""``python -m tools ...`` is the same as the ``leasefs`` console script (the test harness
and ``leasefs cluster up`` start servers this way, so no installed script is needed)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
