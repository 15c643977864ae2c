"""Default config of the built-in engine: the subset of Dassl's keys it honours.

Values equal Dassl's defaults (dassl/config/defaults.py), so one YAML file
gives the same run on both engines. A key outside this tree is refused by
yacs when merged, and the CLI reports it as unsupported by this engine.
"""

from __future__ import annotations

from yacs.config import CfgNode as CN

from dael_plugin.config import add_dael_config
from dael_plugin.config.keys import SOURCE_SAMPLERS, key_value
from dael_plugin.errors import DAELConfigError


def get_builtin_cfg() -> CN:
    _C = CN()
    _C.VERSION = 1
    _C.OUTPUT_DIR = "./output"
    _C.RESUME = ""
    _C.SEED = -1
    _C.USE_CUDA = True
    _C.VERBOSE = True

    _C.INPUT = CN()
    _C.INPUT.SIZE = (224, 224)
    _C.INPUT.INTERPOLATION = "bilinear"
    _C.INPUT.TRANSFORMS = ()
    _C.INPUT.PIXEL_MEAN = [0.485, 0.456, 0.406]
    _C.INPUT.PIXEL_STD = [0.229, 0.224, 0.225]
    _C.INPUT.CROP_PADDING = 4
    _C.INPUT.RRCROP_SCALE = (0.08, 1.0)
    _C.INPUT.CUTOUT_N = 1
    _C.INPUT.CUTOUT_LEN = 16
    _C.INPUT.GN_MEAN = 0.0
    _C.INPUT.GN_STD = 0.15
    _C.INPUT.RANDAUGMENT_N = 2
    _C.INPUT.RANDAUGMENT_M = 10
    _C.INPUT.COLORJITTER_B = 0.4
    _C.INPUT.COLORJITTER_C = 0.4
    _C.INPUT.COLORJITTER_S = 0.4
    _C.INPUT.COLORJITTER_H = 0.1
    _C.INPUT.RGS_P = 0.2
    _C.INPUT.GB_P = 0.5
    _C.INPUT.GB_K = 21

    _C.DATASET = CN()
    _C.DATASET.ROOT = ""
    _C.DATASET.NAME = ""
    _C.DATASET.SOURCE_DOMAINS = ()
    _C.DATASET.TARGET_DOMAINS = ()
    _C.DATASET.CIFAR_C_TYPE = ""  # CIFAR10C / CIFAR100C: the corruption of the test images
    _C.DATASET.CIFAR_C_LEVEL = 1  # and its severity, 1 to 5
    _C.DATASET.NUM_LABELED = -1  # CIFAR10 / CIFAR100 / SVHN: labeled training images, over all classes
    _C.DATASET.VAL_PERCENT = 0.1  # and the share of each class held out as val
    _C.DATASET.STL10_FOLD = -1  # STL10: its labeled fold, 0 to 4
    _C.DATASET.ALL_AS_UNLABELED = False  # semi-supervised sets: the labeled images are unlabeled ones too
    _C.DATASET.NUM_SHOTS = -1  # WILDS: the training images kept of each class in each metadata domain

    _C.DATALOADER = CN()
    _C.DATALOADER.NUM_WORKERS = 4
    _C.DATALOADER.K_TRANSFORMS = 1  # views of each training image (SE, CDAC: 2)
    _C.DATALOADER.TRAIN_X = CN()
    _C.DATALOADER.TRAIN_X.SAMPLER = "RandomSampler"
    _C.DATALOADER.TRAIN_X.BATCH_SIZE = 32
    _C.DATALOADER.TRAIN_X.N_DOMAIN = 0
    _C.DATALOADER.TRAIN_U = CN()
    _C.DATALOADER.TRAIN_U.SAME_AS_X = True
    _C.DATALOADER.TRAIN_U.SAMPLER = "RandomSampler"
    _C.DATALOADER.TRAIN_U.BATCH_SIZE = 32
    _C.DATALOADER.TEST = CN()
    _C.DATALOADER.TEST.SAMPLER = "SequentialSampler"
    _C.DATALOADER.TEST.BATCH_SIZE = 32

    _C.MODEL = CN()
    _C.MODEL.BACKBONE = CN()
    _C.MODEL.BACKBONE.NAME = ""
    _C.MODEL.BACKBONE.PRETRAINED = True
    _C.MODEL.INIT_WEIGHTS = ""  # a SourceOnly checkpoint to start from (ADDA, AdaBN need one)

    _C.OPTIM = CN()
    _C.OPTIM.NAME = "adam"
    _C.OPTIM.LR = 0.0003
    _C.OPTIM.WEIGHT_DECAY = 5e-4
    _C.OPTIM.MOMENTUM = 0.9
    _C.OPTIM.SGD_DAMPNING = 0
    _C.OPTIM.SGD_NESTEROV = False
    _C.OPTIM.ADAM_BETA1 = 0.9
    _C.OPTIM.ADAM_BETA2 = 0.999
    _C.OPTIM.LR_SCHEDULER = "single_step"
    _C.OPTIM.STEPSIZE = (-1,)
    _C.OPTIM.GAMMA = 0.1
    _C.OPTIM.MAX_EPOCH = 10

    _C.TRAIN = CN()
    _C.TRAIN.CHECKPOINT_FREQ = 0
    _C.TRAIN.PRINT_FREQ = 10
    _C.TRAIN.COUNT_ITER = "train_x"

    _C.TEST = CN()
    _C.TEST.EVALUATOR = "Classification"
    _C.TEST.SPLIT = "test"
    _C.TEST.FINAL_MODEL = "last_step"
    _C.TEST.NO_TEST = False
    _C.TEST.PER_CLASS_RESULT = False
    _C.TEST.COMPUTE_CMAT = False

    _C.TRAINER = CN()
    _C.TRAINER.NAME = ""
    # Dassl's baselines on this engine: their keys and Dassl's defaults (dassl/config/defaults.py)
    _C.TRAINER.M3SDA = CN()
    _C.TRAINER.M3SDA.LMDA = 0.5  # weight of the moment distance
    _C.TRAINER.M3SDA.N_STEP_F = 4  # steps of F on the discrepancy (step C), as MCD's
    _C.TRAINER.MME = CN()
    _C.TRAINER.MME.LMDA = 0.1  # weight of the entropy loss
    _C.TRAINER.MCD = CN()
    _C.TRAINER.MCD.N_STEP_F = 4  # steps of F on the discrepancy (step C)
    _C.TRAINER.CDAC = CN()
    _C.TRAINER.CDAC.CLASS_LR_MULTI = 10  # the classifier's learning rate over the backbone's
    _C.TRAINER.CDAC.RAMPUP_COEF = 30  # weight of the consistency loss, once ramped up
    _C.TRAINER.CDAC.RAMPUP_ITRS = 1000  # steps of its sigmoid ramp-up (0: none)
    _C.TRAINER.CDAC.TOPK_MATCH = 5  # largest feature dimensions two target images share to be alike
    _C.TRAINER.CDAC.P_THRESH = 0.95  # confidence at which a pseudo-label is kept
    _C.TRAINER.CDAC.STRONG_TRANSFORMS = ()  # the strong view (Dassl's configs: randaugment, normalize)
    _C.TRAINER.CROSSGRAD = CN()
    _C.TRAINER.CROSSGRAD.EPS_F = 1.0  # step along the domain net's input gradient (the label net's images)
    _C.TRAINER.CROSSGRAD.EPS_D = 1.0  # step along the label net's input gradient (the domain net's images)
    _C.TRAINER.CROSSGRAD.ALPHA_F = 0.5  # weight of the perturbed images in the label net's loss
    _C.TRAINER.CROSSGRAD.ALPHA_D = 0.5  # weight of the perturbed images in the domain net's loss
    _C.TRAINER.DDAIG = CN()
    _C.TRAINER.DDAIG.G_ARCH = ""  # the generator: fcn_3x32_gctx, fcn_3x64_gctx (and their _stn forms)
    _C.TRAINER.DDAIG.LMDA = 0.3  # weight of the perturbation, x + LMDA * p
    _C.TRAINER.DDAIG.CLAMP = False  # clamp the generated images to [CLAMP_MIN, CLAMP_MAX]
    _C.TRAINER.DDAIG.CLAMP_MIN = -1.0
    _C.TRAINER.DDAIG.CLAMP_MAX = 1.0
    _C.TRAINER.DDAIG.WARMUP = 0  # epochs of the label net on the real images alone
    _C.TRAINER.DDAIG.ALPHA = 0.5  # weight of the generated images in the label net's loss
    _C.TRAINER.DOMAINMIX = CN()
    _C.TRAINER.DOMAINMIX.TYPE = "crossdomain"  # partners from the other domains ("random": any)
    _C.TRAINER.DOMAINMIX.ALPHA = 1.0  # Beta(ALPHA, BETA) of the mixing weight (both > 0, as Dassl's)
    _C.TRAINER.DOMAINMIX.BETA = 1.0
    _C.TRAINER.SE = CN()
    _C.TRAINER.SE.EMA_ALPHA = 0.999  # the teacher's EMA rate (at most; 1 - 1/(step+1) before)
    _C.TRAINER.SE.CONF_THRE = 0.95  # teacher confidence above which a target image counts (0: ramp-up)
    _C.TRAINER.SE.RAMPUP = 300  # steps of the sigmoid ramp-up of the target loss (CONF_THRE 0)
    # Dassl's semi-supervised trainers (dassl/engine/ssl), on a DA dataset's unlabeled target
    _C.TRAINER.ENTMIN = CN()
    _C.TRAINER.ENTMIN.LMDA = 1e-3  # weight of the target entropy
    _C.TRAINER.FIXMATCH = CN()
    _C.TRAINER.FIXMATCH.WEIGHT_U = 1.0  # weight of the pseudo-label loss
    _C.TRAINER.FIXMATCH.CONF_THRE = 0.95  # confidence at which a pseudo-label is kept
    _C.TRAINER.FIXMATCH.STRONG_TRANSFORMS = ()  # the strong view (Dassl's config: randaugment_fixmatch, ...)
    _C.TRAINER.MEANTEACHER = CN()
    _C.TRAINER.MEANTEACHER.WEIGHT_U = 1.0  # weight of the consistency loss, once ramped up
    _C.TRAINER.MEANTEACHER.EMA_ALPHA = 0.999  # the teacher's EMA rate (at most; 1 - 1/(step+1) before)
    _C.TRAINER.MEANTEACHER.RAMPUP = 5  # epochs of the sigmoid ramp-up of the consistency weight
    _C.TRAINER.MIXMATCH = CN()
    _C.TRAINER.MIXMATCH.WEIGHT_U = 100.0  # weight of the target's squared error, once ramped up
    _C.TRAINER.MIXMATCH.TEMP = 2.0  # the sharpening temperature of the guessed labels
    _C.TRAINER.MIXMATCH.MIXUP_BETA = 0.75  # Beta(MIXUP_BETA, MIXUP_BETA) of the mixing weights
    _C.TRAINER.MIXMATCH.RAMPUP = 20000  # steps of the linear ramp-up of WEIGHT_U
    return add_dael_config(_C)  # TRAINER.DAEL / TRAINER.DAELDG, from the one key table


# Values of supported keys that the built-in engine cannot honour.
SUPPORTED_VALUES = {
    "DATALOADER.TRAIN_X.SAMPLER": SOURCE_SAMPLERS,
    "DATALOADER.TRAIN_U.SAMPLER": ("RandomSampler",),
    "DATALOADER.TEST.SAMPLER": ("SequentialSampler",),
    "OPTIM.NAME": ("sgd", "adam", "adamw"),
    "OPTIM.LR_SCHEDULER": ("cosine", "single_step", "multi_step"),
    "TRAIN.COUNT_ITER": ("train_x", "train_u", "smaller_one"),  # Dassl's TrainerXU's (engine/loop.py)
    "TEST.EVALUATOR": ("Classification",),
    "TEST.FINAL_MODEL": ("last_step",),
}


def check_supported_values(cfg: CN, where: str, advice: str) -> None:
    """One line for a value of a key in :data:`SUPPORTED_VALUES` that the plugin's loop cannot
    honour (the built-in engine's methods, and the plugin's methods on the Dassl engine)."""
    for key, allowed in SUPPORTED_VALUES.items():
        value = key_value(cfg, key)
        if value not in allowed:
            raise DAELConfigError(f"{key}={value!r}: {cfg.TRAINER.NAME} takes {list(allowed)} {where}; {advice}")
