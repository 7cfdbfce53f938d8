"""What a build promises its server: the text preprocessing its training data went through
(``preprocess``) and the rule that says "none of my intents" (``reject``).

The train stage writes both into ``contract.json`` beside the model; the export copies them
into each build's ``preprocessing.json``; the model server applies them to every request.
"""
