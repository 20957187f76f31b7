from grpojob.cli import main

raise SystemExit(main())
