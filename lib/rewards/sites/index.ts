// Milestone detectors per REAL site. Sites without an entry (dashdish, staynb, ...) and MiniWoB (site null)
// get the general shaping terms only.

import type { MilestoneDetector } from '../milestones';
import { gocalendarMilestones } from './gocalendar';
import { gomailMilestones } from './gomail';
import { omnizonMilestones } from './omnizon';
import { zilloftMilestones } from './zilloft';

export const SITE_MILESTONES: Readonly<Record<string, readonly MilestoneDetector[]>> = {
  gomail: gomailMilestones,
  gocalendar: gocalendarMilestones,
  omnizon: omnizonMilestones,
  zilloft: zilloftMilestones,
};

/** The site's detectors in funnel order; [] for a site without milestones (or null). */
export function milestonesFor(site: string | null | undefined): readonly MilestoneDetector[] {
  if (typeof site !== 'string' || !Object.hasOwn(SITE_MILESTONES, site)) return [];
  return SITE_MILESTONES[site];
}
