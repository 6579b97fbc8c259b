-- SPDX-License-Identifier: MIT
-- Checks the links of Markdown files: every relative link names a file or
-- folder that exists, and every #anchor a heading of the page it points
-- into (GitHub's anchors: the heading in lower case, punctuation dropped,
-- spaces as hyphens, "-1", "-2" ... after repeats). Links to http(s) and
-- mailto are not followed; code blocks and code spans are skipped.
-- usage: lua tools/check_links.lua FILE.md ...   (run from the checkout's root)
-- Prints one line per broken link ("file:line: link: why") and exits 1
-- when there is one; else prints "links: ok (N links in M files)".

local read = require("tools.read_file")

-- The anchors of a page's headings, as a set.
local anchors_of = {}
local function anchors(path)
  if anchors_of[path] then return anchors_of[path] end
  local set, seen, fence = {}, {}, false
  for line in ((read(path) or "") .. "\n"):gmatch("(.-)\n") do
    if line:match("^```") then
      fence = not fence
    elseif not fence then
      local text = line:match("^#+%s+(.-)%s*$")
      if text then
        local a = text:lower():gsub("[^%w%-_ ]", ""):gsub(" ", "-")
        local n = seen[a]
        seen[a] = (n or -1) + 1
        set[n and (a .. "-" .. (n + 1)) or a] = true
      end
    end
  end
  anchors_of[path] = set
  return set
end

-- The folder of a path ("" for the current one), and a path joined to it
-- with "." and ".." resolved.
local function dir_of(path)
  return path:match("^(.*/)") or ""
end
local function join(dir, rel)
  local parts = {}
  for p in (dir .. rel):gmatch("[^/]+") do
    if p == ".." and #parts > 0 and parts[#parts] ~= ".." then
      parts[#parts] = nil
    elseif p ~= "." then
      parts[#parts + 1] = p
    end
  end
  return table.concat(parts, "/")
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return os.execute("test -e '" .. path:gsub("'", "'\\''") .. "'") == true
end

local broken, links = 0, 0
for _, file in ipairs(arg) do
  local text = read(file)
  if not text then
    print(file .. ": cannot be read")
    broken = broken + 1
  else
    local fence, n = false, 0
    for line in (text .. "\n"):gmatch("(.-)\n") do
      n = n + 1
      if line:match("^%s*```") then
        fence = not fence
      elseif not fence then
        for target in line:gsub("`[^`]*`", ""):gmatch("%]%(([^)%s]+)%)") do
          links = links + 1
          local why
          if not target:match("^https?:") and not target:match("^mailto:") then
            local path, anchor = target:match("^([^#]*)#?(.*)$")
            local into = path == "" and file or join(dir_of(file), path)
            if path ~= "" and not exists(into) then
              why = "no such file"
            elseif anchor ~= "" then
              if not into:match("%.md$") then
                why = "an anchor into a file that is not Markdown"
              elseif not anchors(into)[anchor] then
                why = "no heading #" .. anchor .. " in " .. into
              end
            end
          end
          if why then
            print(string.format("%s:%d: %s: %s", file, n, target, why))
            broken = broken + 1
          end
        end
      end
    end
  end
end
if broken > 0 then os.exit(1) end
print(string.format("links: ok (%d links in %d files)", links, #arg))
