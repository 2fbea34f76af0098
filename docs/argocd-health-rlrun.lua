-- Argo CD health check for rlkube.dev RLRun and SFTRun. Install it in argocd-cm as
--   resource.customizations.health.rlkube.dev_RLRun  (and the same for rlkube.dev_SFTRun).
-- Conditions are looked up by type, never by position; a status older than the spec says
-- nothing yet (Progressing).
local hs = { status = "Progressing", message = "waiting for the rlkube operator" }
if obj.status == nil then
  return hs
end

local function condition(type_)
  if obj.status.conditions == nil then
    return nil
  end
  for _, c in ipairs(obj.status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

if obj.metadata.generation ~= nil and obj.status.observedGeneration ~= obj.metadata.generation then
  hs.message = "the operator has not reconciled the latest spec yet"
  return hs
end

local stuck = { CrashLoopBackOff = true, ImagePullBackOff = true, ErrImagePull = true,
                InvalidImageName = true, CreateContainerConfigError = true, CreateContainerError = true }
local phase = obj.status.phase
local ready = condition("Ready")
hs.message = obj.status.message or ""

if phase == "Failed" then
  hs.status = "Degraded"
elseif phase == "Succeeded" then
  hs.status = "Healthy"
elseif phase == "Suspended" then
  hs.status = "Suspended"
elseif phase == "Running" and ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
elseif ready ~= nil and stuck[ready.reason] then
  hs.status = "Degraded"
end

-- A running run whose component crash-loops or lost readiness stays Running; its Degraded
-- condition names the component: Degraded when it is stuck, Progressing while it comes back.
local degraded = condition("Degraded")
if phase == "Running" and degraded ~= nil and degraded.status == "True" then
  hs.message = degraded.message
  if stuck[degraded.reason] then
    hs.status = "Degraded"
  else
    hs.status = "Progressing"
  end
end

local accepted = condition("SpecAccepted")
if accepted ~= nil and accepted.status == "False" then
  hs.status = "Degraded"
  hs.message = accepted.message
end
return hs
