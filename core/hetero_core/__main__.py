from hetero_core.cli import console_main

console_main()
