from tests.stub_child import main

main()
