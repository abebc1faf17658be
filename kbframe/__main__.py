from .cli.main import main
from .cli.speed import main_then_exit

main_then_exit(main)
