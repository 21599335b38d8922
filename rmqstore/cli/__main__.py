"""``python -m rmqstore.cli``: the rmqstore command."""
import sys

from rmqstore.cli import main

sys.exit(main())
