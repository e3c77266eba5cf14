"""The console commands (vit-train, vit-evaluate, vit-visualize, vit-explore, vit-predict). Only
vit.commands.entry, the console scripts' target, imports them; this package imports nothing."""
