from worker.trainers.torch.train import main

main()
