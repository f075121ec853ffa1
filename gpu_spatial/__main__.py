import sys

from gpu_spatial.cli import main

sys.exit(main())
