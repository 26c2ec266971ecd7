from worker.trainers.torch.child import main

main()
