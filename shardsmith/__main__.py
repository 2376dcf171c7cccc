from shardsmith.program import main

main()
