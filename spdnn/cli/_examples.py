"""The examples that ``spdnn --help`` and ``spdnn COMMAND --help`` print."""

EXAMPLES = """\
examples:
  spdnn generate random --sizes 64,256,256 --fan-in 16 --head 10 -o net.npz
  spdnn train --network net.npz --data digits --epochs 30 --batch-size 32 --lr 0.05 \\
      --momentum 0.9 --save trained.npz
  spdnn infer --network trained.npz --inputs digits
  spdnn convert graphchallenge ../shared/data/graphchallenge/neuron1024 --bias -0.3 --cap 32 \\
      --dtype float32 -o gc1024.npz
  spdnn infer --network gc1024.npz \\
      --inputs ../shared/data/graphchallenge/sparse-images-1024_subset.mtx \\
      --categories-out categories.tsv
"""

EXAMPLES_BY_COMMAND = {
    "convert": """\
examples:
  spdnn convert graphchallenge ../shared/data/graphchallenge/neuron1024 --bias -0.3 --cap 32 \\
      --dtype float32 -o gc1024.npz
  spdnn convert mtx layer1.mtx layer2.mtx --bias 0 --dtype float32 -o net.npz
  spdnn convert network net.npz --to mtx -o net-mtx/
  spdnn convert safetensors pruned_mlp.safetensors --layers fc1,fc2,fc3 -o mlp.npz
  spdnn convert network trained.npz --to safetensors -o trained.safetensors
""",
    "plot": """\
examples:
  spdnn train --network net.npz --data digits --epochs 20 --metrics-out train.json
  spdnn plot train.json -o train.png
""",
    "radixnet": """\
examples:
  spdnn generate radixnet --neurons 1024 --layers 120 --seed 0 -o rx1024.npz
  spdnn generate radixnet --neurons 4096 --layers 3 --head 10 -o rx4096-head.npz
""",
    "local": """\
examples:
  spdnn generate local --image 8x8 --hidden 16x16,16x16 --radius 1 --head 10 -o local.npz
  spdnn generate local --image 28x28 --hidden 32x32,32x32 --radius 2 --head 10 -o mnist-local.npz
""",
    "challenge-images": """\
examples:
  spdnn generate challenge-images --mnist ../shared/data/mnist --size 32 -o images32.npz
  spdnn generate radixnet --neurons 1024 --layers 120 --bias -0.3 -o rx1024.npz
  spdnn infer --network rx1024.npz --inputs images32.npz --categories-out categories.tsv
""",
    "xc-data": """\
examples:
  spdnn generate xc-data --samples 5000 --features 2000 --labels 1000 -o xc-small
  spdnn generate random --sizes 2000,128,1000 --fan-in 128 -o xc-net.npz
  spdnn train --network xc-net.npz --data xc:xc-small --epochs 5 --lr 0.5
""",
    "random": """\
examples:
  spdnn generate random --sizes 784,1024,1024 --fan-in 32 --head 10 -o mlp.npz
  spdnn generate random --sizes 64,256,256 --fan-in 16 --head 10 -o net.npz
""",
    "prune": """\
examples:
  spdnn generate prune --weights dense.npz --density 0.05 --head 10 -o pruned.npz
""",
    "train": """\
examples:
  spdnn train --network net.npz --data digits --epochs 30 --batch-size 32 --save trained.npz
  mpirun -n 2 spdnn train --network net.npz --plan plan2.npz --data digits \\
      --checkpoint-dir ckpt --checkpoint-every 500
  mpirun -n 3 spdnn train --network net.npz --plan plan3.npz --data digits --resume ckpt
  mpirun -n 4 spdnn train --network net.npz --plan plan2.npz --replicas 2 --data digits
  mpirun -n 4 spdnn train --network net.npz --plan plan2.npz --plan plan4.npz \\
      --replicas auto --calibration machine.json --data digits   # the grid the model picks
  spdnn train --network net.npz --data digits --threads 2       # one rank, 2 kernel threads
  mpirun -n 2 spdnn train --network net.npz --plan plan2.npz --data digits --exchange dense
""",
    "calibrate": """\
examples:
  mpirun -n 2 spdnn calibrate -o machine.json      # one rank per core of a node
  mpirun -n 2 spdnn calibrate -o quick.json --quick  # a coarse grid, a third of the time
  spdnn-partition model net.npz --plans plan2.npz plan4.npz --batch-size 256 \\
      --calibration machine.json --replicas 1,2,4
""",
    "infer": """\
examples:
  spdnn infer --network trained.npz --inputs digits
  mpirun -n 2 spdnn infer --network gc1024.npz --plan plan2.npz \\
      --inputs ../shared/data/graphchallenge/sparse-images-1024_subset.mtx \\
      --categories-out categories.tsv
""",
}
