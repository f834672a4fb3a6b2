-- pg_post.lua - wrk script for bench_pg.sh: POSTs one fenced UPDATE of a random row of bench
-- (ids 1..@ROWS@, substituted by bench_pg.sh) under lock L.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

local rows = @ROWS@
local fmt = '{"lock":"L","statements":[{"sql":"UPDATE bench SET n = n + 1 WHERE id = $1",' ..
            '"params":[%d]}]}'

request = function()
  return wrk.format(nil, nil, nil, string.format(fmt, math.random(1, rows)))
end
