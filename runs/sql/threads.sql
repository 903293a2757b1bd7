-- Conversations (runs.threads): the lock order of a thread and its turns.

-- name: lock_thread_of_run
-- The thread of a run that is a turn, locked before the run: every change of
-- a turn's status takes its thread's row first (a message posted to the
-- thread, a person's action on the turn, the exit from running, the
-- reaper's expiry), so that two of them never wait for each other's rows in
-- opposite orders. No row: the run is not a turn.
SELECT t.id FROM runs_thread t JOIN runs_run r ON r.thread_id = t.id
WHERE r.id = %(run)s
FOR NO KEY UPDATE OF t
