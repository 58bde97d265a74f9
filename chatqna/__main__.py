from chatqna.cli import main

main()
