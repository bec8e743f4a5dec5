/**
 * The stack's one file-mode policy for what one process writes and another reads (blobs here; adapters and
 * their copies in the learner, workers/learner/halo_learner/file_modes.py): the writer and its group read,
 * nobody else. Compose runs every service that touches ./runs or ./checkpoints as one uid:gid
 * (docs/operations.md, "File modes"). Set with chmod after creation, so a process's umask cannot narrow it
 * (0600 files would lock out a second uid of the group) or widen it.
 */
export const FILE_MODE = 0o640;
export const DIR_MODE = 0o750;
